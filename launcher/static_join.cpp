// The static join of the store rendezvous (store_join.h): this node is
// --node-rank of exactly --nnodes nodes, and the store is node 0's at
// --master-addr:--master-port.
#include "errors.h"
#include "store_join.h"

namespace ddprun {
namespace {

class StaticJoin : public StoreJoin {
 public:
  explicit StaticJoin(const StoreConfig& config) : c_(config) {}

  StoreWording wording() const override {
    return {"--master-addr/--master-port", "--master-addr", "--master-port", "node 0's ddprun"};
  }

  // This node is --node-rank of --nnodes, unless another node has that rank
  // already.
  void take_place(StoreLink& link, RoundState& round, const std::string& line, Clock::time_point,
                  Clock::time_point, const Tick&) override {
    round.size = c_.max_nodes;
    round.rank = c_.node_rank;
    const std::string got =
        store_text(link.store().compareSet(round.node(round.rank), {}, store_bytes(line)));
    if (got != line)
      throw LaunchError("node rank " + std::to_string(round.rank) + " of run '" + c_.run_id +
                        "' is already taken (by " + RoundState::host_in(got) +
                        "): give every node a different --node-rank");
  }

  std::string master_address() const override { return c_.master_addr; }

  // A static group has its --nnodes nodes: nobody waits to join it.
  std::optional<std::string> admission(c10d::TCPStore&, const RoundState&) const override { return std::nullopt; }

 private:
  const StoreConfig& c_;
};

}  // namespace

std::unique_ptr<StoreJoin> make_static_join(const StoreConfig& config) {
  return std::make_unique<StaticJoin>(config);
}

}  // namespace ddprun
