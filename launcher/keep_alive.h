// The store rendezvous's keep-alive: every node adds to its own counter in
// the store every keep_alive_interval while its workers run; a node whose
// counter stays still for keep_alive_max_attempt intervals has lapsed (its
// ddprun died without a word: SIGKILL, power, a link down) and counts as
// gone.
#pragma once

#include <cstdint>
#include <vector>

#include "cli.h"
#include "round_state.h"
#include "store_link.h"

namespace ddprun {

class KeepAlive {
 public:
  KeepAlive(StoreLink& link, const RoundState& round, const RdzvConf& conf);

  // A new round: every node of it counts as alive from now, and this node's
  // first beat is due at once.
  void start();
  // Adds to this node's counter if keep_alive_interval has passed since its
  // last beat; returns whether it did (and the others' counters are worth a
  // look).
  bool beat(Clock::time_point now);
  // Whether node i's counter has not moved for the limit. Reads it: call at
  // most every few hundred ms.
  bool lapsed(int i, Clock::time_point now);
  // How many of the other nodes have lapsed.
  int lapsed_others();
  // The limit in whole seconds, for messages.
  int limit_s() const { return static_cast<int>(limit_s_); }

 private:
  StoreLink& link_;
  const RoundState& round_;
  const Clock::duration interval_;
  const double limit_s_;          // interval x keep_alive_max_attempt
  const Clock::duration limit_;
  std::vector<int64_t> seen_;    // each node's count when last read
  std::vector<Clock::time_point> changed_;
  Clock::time_point next_beat_{};
};

}  // namespace ddprun
