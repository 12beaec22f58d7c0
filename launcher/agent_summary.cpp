// The agent's summary: torchrun's block on stderr when the group gives up,
// naming the root cause (this node's first failing worker, a stopped worker,
// or another node's record) and the other failures. A deliberate stop for
// preemption (exit 75 after a checkpoint) is summarized as that, not as a
// failure, unless another worker failed otherwise meanwhile.
#include "agent.h"

#include <sys/wait.h>

#include <ctime>

#include "ddp/errors.h"
#include "error_file.h"

namespace ddprun {
namespace {

std::string timestamp(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::localtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

// torchrun's layout; the traceback lines are indented under their field.
std::string indented(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '\n' ? std::string("\n    ") : std::string(1, c);
  return out;
}

}  // namespace

void Agent::print_summary() const {
  std::string program = o_.program;
  std::string bar(60, '=');
  // Exit 75 (ddp::kPreemptedExitCode) first: the workers saved a checkpoint
  // on a warning (SIGUSR1, SIGTERM) and stopped so that the job is requeued.
  const bool preempted = round_end_ && !round_end_->admits_nodes() && !stalled_ &&
                         round_end_->exit_code == ddp::kPreemptedExitCode;
  bool root_here = false, stalled_here = false;
  if (!local_failures_.empty()) {
    const Worker& first = workers_[local_failures_.front()];
    root_here = round_end_ && round_end_->text == failure_text(first);
    stalled_here = stalled_ && round_end_ && round_end_->text == stalled_text(first);
  }
  // The other failures first: under a preemption, a worker that failed
  // otherwise (a crash, an error) makes the stop no longer "not a failure".
  size_t shown = 0;
  std::string others;
  for (size_t i = root_here ? 1 : 0; i < local_failures_.size(); ++i) {
    const Worker& w = workers_[local_failures_[i]];
    // Under a preemption, the other workers that checkpointed and stopped too are no failures.
    if (preempted && exit_code_of(*w.process->exit_status()) == ddp::kPreemptedExitCode) continue;
    others += summary_block(w);
    ++shown;
  }
  const std::string header = !preempted ? " FAILED"
                             : shown    ? " STOPPED FOR PREEMPTION, WITH FAILURES (listed under Failures)"
                                        : " STOPPED FOR PREEMPTION (not a failure)";
  std::string out = bar + "\n" + program + header + "\n" + std::string(60, '-') + "\n";
  out += preempted ? preemption_section(root_here) : root_cause_section(root_here, stalled_here);
  const std::string none = preempted ? "  <NO_FAILURES>\n" : "  <NO_OTHER_FAILURES>\n";
  out += std::string(60, '-') + (preempted ? "\nFailures:\n" : "\nOther Failures:\n") + (shown ? others : none) + bar +
         "\n";
  write_all(2, out);
}

std::string Agent::summary_block(const Worker& w, bool failure) const {
  int st = *w.process->exit_status();
  std::string code = std::to_string(exit_code_of(st));
  if (WIFSIGNALED(st)) code += " (" + signal_name(WTERMSIG(st)) + ")";
  std::string problem;
  auto error = read_error_file(w.error_file, &problem);
  auto when = w.exit_time;
  if (error && error->timestamp)  // torchrun's time is the error's when there is one
    when = std::chrono::system_clock::from_time_t(static_cast<std::time_t>(*error->timestamp));
  std::string s;
  s += "  time      : " + timestamp(when) + "\n";
  s += "  host      : " + host_ + "\n";
  s += "  rank      : " + std::to_string(w.rank) + " (local_rank: " + std::to_string(w.local_rank) + ")\n";
  s += "  exitcode  : " + code + " (pid: " + std::to_string(w.process->pid()) + ")\n";
  std::string logs = w.stdout_log;
  if (!w.stderr_log.empty()) logs += (logs.empty() ? "" : ", ") + w.stderr_log;
  s += "  log files : " + (logs.empty() ? std::string("<none: use --log-dir to keep them>") : logs) + "\n";
  if (error) {
    s += "  error_file: " + w.error_file + (private_run_dir_ ? " (removed when ddprun exits)" : "") + "\n";
    s += "  traceback : " + indented(error->traceback) + "\n";
  } else if (failure) {
    if (problem.empty()) {
      s += "  error_file: <N/A>\n";
      s += "  traceback : <N/A> (the worker wrote no error file; ddp::guarded_main or ddp::record_error in C++, "
           "@record in Python, write one)\n";
    } else {
      s += "  error_file: <N/A> (" + w.error_file + ": " + problem + ")\n";
      s += "  traceback : <N/A>\n";
    }
  }
  return s;
}

std::string Agent::preemption_section(bool root_here) const {
  const std::string code = std::to_string(ddp::kPreemptedExitCode);
  std::string out = "Stopped For Preemption (first worker to stop):\n";
  if (root_here) {
    out += summary_block(workers_[local_failures_.front()], /*failure=*/false);
  } else {
    out += "  " + round_end_->text + "\n";
    if (!round_end_->message.empty()) out += "  message   : " + indented(round_end_->message) + "\n";
  }
  out += "  meaning   : the workers saved a checkpoint on the preemption warning (SIGUSR1, or SIGTERM), or, "
         "under --recover-in-process, when fewer ranks than --nnodes' minimum were left, and exited " +
         code + " (ddp::kPreemptedExitCode);\n    ddprun exits " + code +
         " without restarting them; the job run again (the Slurm templates requeue it) resumes from that "
         "checkpoint\n";
  return out;
}

std::string Agent::root_cause_section(bool root_here, bool stalled_here) const {
  std::string out = "Root Cause (first observed failure):\n";
  if (stalled_here) {
    const Worker& w = workers_[*stalled_];
    out += "  " + w.stop.describe(w.rank, w.process->pid()) + "; the other ranks' failures follow from it\n";
    out += summary_block(w);
  } else if (root_here) {
    out += summary_block(workers_[local_failures_.front()]);
  } else if (round_end_) {
    out += "  " + round_end_->text + "\n";
    out += "  exitcode  : " + std::to_string(round_end_->exit_code) + "\n";
    if (!round_end_->message.empty()) out += "  message   : " + indented(round_end_->message) + "\n";
  }
  return out;
}

}  // namespace ddprun
