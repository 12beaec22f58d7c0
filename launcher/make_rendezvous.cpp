// make_rendezvous: which rendezvous the options ask for, and the one-node
// LocalRendezvous that needs no store.
#include <unistd.h>

#include "errors.h"
#include "net.h"
#include "store_module.h"

namespace ddprun {
namespace {

// One node: nothing to agree on. The workers' master is this machine.
class LocalRendezvous : public Rendezvous {
 public:
  LocalRendezvous(std::string addr, int port) : addr_(std::move(addr)), port_(port) {}
  Assignment join(int round, int local_world_size, const Tick&) override {
    Assignment a;
    a.round = round;
    a.world_size = local_world_size;
    a.master_addr = addr_;
    a.master_port = port_;
    a.nodes = {this_hostname() + "[" + std::to_string(::getpid()) + "]"};
    return a;
  }
  std::optional<RoundEnd> poll(bool) override { return std::nullopt; }
  RoundEnd report_failure(const RoundEnd& r) override { return r; }
  void report_lost_worker(int, int, const std::string&) override {}
  std::optional<std::string> lost_reason(int, int) override { return std::nullopt; }
  int64_t lost_count(int) override { return 0; }
  bool still_joining(int, int) override { return false; }
  void forget_joining(int, int) override {}
  void note_finished(int) override {}
  int finished_anywhere() override { return 1; }
  void mark_done() override {}
  bool all_done() override { return true; }
  void acknowledge_end() override {}
  void finish(const Tick&) override {}

 private:
  std::string addr_;
  int port_;
};

// What every node of a run must have alike.
std::string fingerprint(const Options& o) {
  return "--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) + " --max-restarts " +
         std::to_string(o.max_restarts) + " --rdzv-backend " + o.rdzv_backend +
         (o.recover_in_process ? " --recover-in-process" : "");
}

// One node's store, served by this ddprun: on loopback at a free port
// (--standalone), else at --master-addr:--master-port.
StoreConfig one_node_store(const Options& o) {
  StoreConfig c;
  c.run_id = o.run_id;
  c.min_nodes = c.max_nodes = 1;
  c.conf = o.rdzv_conf;
  c.fingerprint = fingerprint(o);
  c.recover_in_process = o.recover_in_process;
  c.host = c.master_addr = o.standalone ? "127.0.0.1" : o.master_addr;
  c.port = o.standalone ? free_port() : o.master_port;
  c.node_rank = 0;
  c.host_store = true;
  return c;
}

}  // namespace

std::unique_ptr<Rendezvous> make_rendezvous(const Options& o, const Tick& tick) {
  const bool one_node = o.standalone || (o.rdzv_backend == "static" && o.max_nodes == 1);
  // --recover-in-process: the workers' store must outlive any of them, so
  // ddprun serves it, on one node too.
  if (o.recover_in_process && one_node) return load_store_rendezvous(one_node_store(o), tick);
  if (o.standalone) return std::make_unique<LocalRendezvous>("127.0.0.1", free_port());
  if (o.rdzv_backend == "static" && o.max_nodes == 1) {
    // The workers' rank 0 will listen on --master-port: say so now, clearly,
    // rather than through a worker's bind error.
    std::string why = port_unavailable_reason(static_cast<uint16_t>(o.master_port));
    if (!why.empty())
      throw LaunchError("--master-port " + std::to_string(o.master_port) + " is not available on this machine (" +
                        why + "); pick another port, or use --standalone to get a free one");
    return std::make_unique<LocalRendezvous>(o.master_addr, o.master_port);
  }
  StoreConfig c;
  c.run_id = o.run_id;
  c.min_nodes = o.min_nodes;
  c.max_nodes = o.max_nodes;
  c.conf = o.rdzv_conf;
  c.local_addr = o.local_addr;
  c.fingerprint = fingerprint(o);
  c.recover_in_process = o.recover_in_process;
  if (o.rdzv_backend == "static") {
    c.host = o.master_addr;
    c.port = o.master_port;
    c.node_rank = o.node_rank;
    c.master_addr = o.master_addr;
    c.host_store = o.node_rank == 0;
  } else {
    c.dynamic = true;
    c.host = o.endpoint_host;
    c.port = o.endpoint_port;
    if (o.rdzv_conf.is_host) {
      c.host_store = *o.rdzv_conf.is_host;
    } else {
      // torchrun's rule: the node the endpoint names serves the store; if
      // another ddprun on that machine already does, join it as a client.
      c.host_store = is_local_host(c.host);
      c.fall_back_to_client = true;
    }
  }
  return load_store_rendezvous(std::move(c), tick);
}

}  // namespace ddprun
