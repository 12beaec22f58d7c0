// How a node takes its place in a round of the store rendezvous, in the two
// flavours (rendezvous.h): the static join (node ranks from --node-rank,
// exactly --nnodes nodes; static_join.cpp) and the c10d join (ranks by
// arrival, MIN..MAX nodes with a last-call window, late nodes waiting to be
// admitted; arrival_join.cpp). What the flavours share (the node lines, the
// world size, the workers' master) is the rendezvous's (store_rendezvous.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "round_state.h"
#include "store_link.h"
#include "store_rendezvous.h"

namespace ddprun {

// How long a join waits quietly before saying what it waits for.
inline constexpr auto kQuietJoin = std::chrono::seconds(5);

class StoreJoin {
 public:
  virtual ~StoreJoin() = default;

  // How this flavour's messages name the store.
  virtual StoreWording wording() const = 0;
  // Takes this node's place in the round `round` has entered: sets
  // round.rank and round.size and writes `line` (RoundState::node_line)
  // under round.node(round.rank). A late c10d node first waits to be
  // admitted, which moves `round` to a later number. Gives up at `deadline`.
  virtual void take_place(StoreLink& link, RoundState& round, const std::string& line, Clock::time_point started,
                          Clock::time_point deadline, const Tick& tick) = 0;
  // The workers' MASTER_ADDR, as node 0 publishes it.
  virtual std::string master_address() const = 0;
  // From the poll of a healthy group: why it should restart to admit the
  // nodes that wait (read on `watch`), or nothing.
  virtual std::optional<std::string> admission(c10d::TCPStore& watch, const RoundState& round) const = 0;
};

std::unique_ptr<StoreJoin> make_static_join(const StoreConfig& config);
std::unique_ptr<StoreJoin> make_arrival_join(const StoreConfig& config);

}  // namespace ddprun
