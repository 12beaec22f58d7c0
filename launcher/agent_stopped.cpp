// The agent and its stopped workers (stopped_workers.h says why they are
// special): the monitor loop notes them on every pass, a group failure names
// the first as its root cause, and teardown SIGKILLs them rather than send a
// SIGTERM they cannot handle and wait out --term-timeout.
#include "agent.h"

#include <signal.h>

namespace ddprun {

void Agent::look_for_stopped() {
  // Not once killed: a dying process may look running for a moment, and
  // the stop that was seen is what the summary reports.
  for (auto& w : workers_)
    if (w.process && !w.process->exited() && !w.killed_stopped) w.stop.look(w.process->pid());
}

std::optional<size_t> Agent::first_stopped() const {
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (w.process && !w.process->exited() && w.stop.stopped()) return i;
  }
  return std::nullopt;
}

std::string Agent::stalled_text(const Worker& first) const {
  const Worker& w = workers_[*stalled_];
  return w.stop.describe(w.rank, w.process->pid()) + " (host " + host_ + "); then rank " +
         std::to_string(first.rank) + " failed (" + describe_status(*first.process->exit_status()) + ")";
}

void Agent::kill_stopped() {
  look_for_stopped();
  for (auto& w : workers_) {
    if (!w.process || w.process->exited() || !w.stop.stopped() || w.killed_stopped) continue;
    say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.process->pid()) +
        ") is stopped and cannot handle SIGTERM; sending SIGKILL");
    w.process->signal_group(SIGKILL);
    w.killed_stopped = true;
  }
}

}  // namespace ddprun
