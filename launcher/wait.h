// The launcher's one way to wait for something another process does (a
// store key, a listening port, the other nodes leaving): poll a condition
// until it holds or a deadline passes. Every wait has a deadline, and every
// wait calls `tick` between polls, so Ctrl-C stops ddprun while it waits.
#pragma once

#include <chrono>
#include <functional>

namespace ddprun {

using Clock = std::chrono::steady_clock;

// Seconds as the command line gives them, as a Clock duration.
Clock::duration seconds(double s);

// Something to say once when a wait has lasted a while ("waiting for nodes
// to join ..."), so a quiet launcher is not mistaken for a hung one.
struct Notice {
  Clock::time_point at = Clock::time_point::max();
  std::function<void()> say;
};

// Evaluates `done` until it returns true (then returns true) or `deadline`
// passes (then returns false). Between evaluations: `notice` once it is due,
// `tick` (which may throw to abort the wait), then a sleep of `poll_interval`.
// Exceptions from `done` and `tick` propagate.
bool wait_until(Clock::time_point deadline, const std::function<void()>& tick, Clock::duration poll_interval,
                const std::function<bool()>& done, const Notice& notice = {});

}  // namespace ddprun
