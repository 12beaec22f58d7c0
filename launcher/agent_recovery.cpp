// The agent under --recover-in-process (agent.h, docs/launcher.md): a worker
// that fails while others run is lost, not a failure of the group; ddprun
// tells the others through the store and goes on.
#include "agent.h"

#include <csignal>

#include "ddp/errors.h"
#include "errors.h"
#include "output.h"

namespace ddprun {

// --recover-in-process: a failed worker whose peers go on is reported to
// them through the store, and the node goes on; not a configuration error
// (exit 2 with a ddp::UsageError) nor a preemption (75), which every rank
// meets alike, and not the last worker of a one-node run.
bool Agent::lose_worker(Worker& w) {
  if (!o_.recover_in_process) return false;
  const int code = exit_code_of(*w.process->exit_status());
  if (code == 2 || code == ddp::kPreemptedExitCode) return false;
  bool others = assignment_.num_nodes > 1;
  for (const auto& other : workers_) others = others || !other.process->exited();
  if (!others) return false;
  try {
    if (w.replacement) rdzv_->forget_joining(round_, w.rank);
    rdzv_->report_lost_worker(round_, w.rank, failure_text(w));
  } catch (const LaunchError& e) {
    say(std::string(e.what()) + "; the workers cannot be told that rank " + std::to_string(w.rank) + " is gone");
    return false;
  }
  w.lost = true;
  say("worker " + failure_text(w) + "; the others go on without it (--recover-in-process)");
  if (restarts_ < o_.max_restarts) replace(w);
  return true;
}

// A worker in place of the lost one, counted against --max-restarts: it
// joins the others at a step boundary they choose (ddp/comm/recovery.h).
void Agent::replace(Worker& w) {
  const int lr = w.local_rank;
  ++restarts_;
  say("starting a worker in place of rank " + std::to_string(w.rank) + " (restart " + std::to_string(restarts_) +
      " of " + std::to_string(o_.max_restarts) + "); it joins the others at a step boundary");
  w = Worker{};
  w.replacement = true;
  start_worker(lr, run_dir_.empty() ? "" : run_dir_ + "/attempt_" + std::to_string(round_));
}

// The others finished: a replacement they never took in is ended.
void Agent::end_waiting_replacements() {
  for (auto& w : workers_) {
    if (!w.replacement || w.process->exited() || w.lost) continue;
    bool waiting = false;
    try {
      waiting = rdzv_->still_joining(round_, w.rank);
    } catch (const LaunchError&) {
      return;
    }
    if (!waiting) continue;
    say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.process->pid()) +
        ") was still waiting to join when the others finished; sending SIGKILL (--recover-in-process)");
    w.reported = w.lost = w.killed_stopped = true;
    w.process->signal_group(SIGKILL);
  }
}

// --recover-in-process: a worker stopped (SIGSTOP) while the others finished
// without it was left out of their group: it is lost, and ended.
void Agent::leave_stopped_behind() {
  look_for_stopped();
  bool finished = false, stopped = false;
  for (const auto& w : workers_) {
    if (w.process->exited()) {
      finished = finished || *w.process->exit_status() == 0;
    } else if (w.stop.stopped()) {
      stopped = true;
    } else {
      return;  // one still runs
    }
  }
  if (!finished || !stopped) return;
  for (auto& w : workers_) {
    if (w.process->exited() || w.killed_stopped) continue;
    say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.process->pid()) + ") " +
        "stayed stopped while the others finished without it; sending SIGKILL (--recover-in-process)");
    w.reported = w.lost = w.killed_stopped = true;
    w.process->signal_group(SIGKILL);
  }
}

// One look of the monitor: false when this node fails after all (one node,
// and no worker of it finished: the last one lost is its failure, in
// local_failures_). A node of several whose workers were all lost waits
// for the others at the exit barrier.
bool Agent::keep_recovering(const Events& e) {
  if (e.poll_due) end_declared_lost();
  leave_stopped_behind();
  if (finished_here() > 0) end_waiting_replacements();
  if (!all_exited() || finished_here() > 0 || assignment_.num_nodes > 1) return true;
  for (size_t i = 0; i < workers_.size(); ++i)
    if (workers_[i].lost) local_failures_.assign(1, i);
  return local_failures_.empty();
}

// The workers declared a worker of this node lost (its heartbeat stopped:
// stopped, hung, its link cut): it is ended, as they go on without it.
void Agent::end_declared_lost() {
  // One read a look: each worker's key only when the count moved, or while a
  // replacement waits to be taken in (it removes its predecessor's key then).
  bool waiting = false;
  for (const auto& w : workers_) waiting = waiting || (w.replacement && !w.taken_in && !w.process->exited());
  try {
    const int64_t count = rdzv_->lost_count(round_);
    if (count == lost_seen_ && !waiting) return;
    lost_seen_ = count;
  } catch (const LaunchError&) {
    return;  // the store is lost; the round's end says so
  }
  for (auto& w : workers_) {
    if (w.process->exited() || w.lost) continue;
    std::optional<std::string> why;
    try {
      why = rdzv_->lost_reason(round_, w.rank);
      // A replacement waits with its predecessor's lost/ key, which it
      // removes once taken in: until then, the key is not about it.
      if (w.replacement && !w.taken_in) {
        w.taken_in = !why;
        continue;
      }
    } catch (const LaunchError&) {
      return;  // the store is lost; the round's end says so
    }
    if (!why) continue;
    say("rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.process->pid()) +
        ") was left out by the other workers (" + *why + "); sending SIGKILL (--recover-in-process)");
    w.reported = w.lost = w.killed_stopped = true;
    w.process->signal_group(SIGKILL);
  }
}

int Agent::finished_here() const {
  int n = 0;
  for (const auto& w : workers_) n += w.process->exited() && *w.process->exit_status() == 0;
  return n;
}

}  // namespace ddprun
