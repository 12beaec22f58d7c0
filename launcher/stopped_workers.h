// Workers that stopped responding because they are stopped: SIGSTOP, a
// terminal's SIGTSTP, or a debugger's tracing stop (/proc/<pid>/stat state
// 'T' or 't'). A stopped worker is no failure by itself (someone may resume
// it); but when the group fails it is the likeliest root cause, the others
// timing out while waiting for it, and the failure summary names it. It
// cannot run a SIGTERM handler either, so teardown SIGKILLs it at once rather
// than wait out --term-timeout for nothing.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>

namespace ddprun {

enum class RunState { Running, Stopped, Traced, Gone };

// The state of `pid` from /proc/<pid>/stat.
RunState run_state(pid_t pid);

// One worker's stop, followed across the monitor loop's passes.
class StopWatch {
 public:
  // Looks at the process again: a stop seen now is remembered with the time
  // it was first seen; a process that runs again forgets it.
  void look(pid_t pid);
  bool stopped() const { return since_.has_value(); }
  void reset() { since_.reset(); }

  // "rank 1 (pid 123) was stopped (SIGSTOP or another stop signal; seen at
  // 12:00:01) and never resumed". Only when stopped().
  std::string describe(int rank, pid_t pid) const;

 private:
  RunState state_ = RunState::Running;
  std::optional<std::chrono::system_clock::time_point> since_;
};

}  // namespace ddprun
