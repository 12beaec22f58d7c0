#include "stopped_workers.h"

#include <ctime>
#include <fstream>

namespace ddprun {

RunState run_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return RunState::Gone;
  // The state follows the parenthesised command name, which may hold ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return RunState::Running;
  switch (line[close + 2]) {
    case 'T': return RunState::Stopped;
    case 't': return RunState::Traced;
    case 'Z':
    case 'X': return RunState::Gone;
    default: return RunState::Running;
  }
}

void StopWatch::look(pid_t pid) {
  const RunState now = run_state(pid);
  if (now == RunState::Stopped || now == RunState::Traced) {
    if (!since_ || now != state_) since_ = std::chrono::system_clock::now();
    state_ = now;
  } else if (now == RunState::Running) {
    since_.reset();
    state_ = now;
  }
  // Gone: an exit is the reaper's news; what was seen before stays.
}

std::string StopWatch::describe(int rank, pid_t pid) const {
  char when[16] = "?";
  if (since_) {
    std::time_t t = std::chrono::system_clock::to_time_t(*since_);
    std::tm tm{};
    ::localtime_r(&t, &tm);
    std::strftime(when, sizeof when, "%H:%M:%S", &tm);
  }
  const std::string how = state_ == RunState::Traced ? "was held in a debugger's tracing stop"
                                                     : "was stopped (SIGSTOP or another stop signal)";
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") " + how + ", seen at " + when +
         ", and never resumed";
}

}  // namespace ddprun
