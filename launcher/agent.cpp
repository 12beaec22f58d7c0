#include "agent.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "ddp/errors.h"
#include "error_file.h"
#include "errors.h"
#include "gpus.h"
#include "membership.h"
#include "net.h"
#include "wait.h"

extern char** environ;

namespace ddprun {
namespace {

namespace fs = std::filesystem;

bool failed(const WorkerProcess& p) { return p.exited() && *p.exit_status() != 0; }

// mkdtemp with a template under `dir`; the run directory is unique even when
// several runs (or nodes on a shared file system) use the same --log-dir.
std::string make_unique_dir(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string tmpl = dir + "/" + prefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data()))
    throw LaunchError("cannot create a log directory in " + dir + ": " + std::strerror(errno) +
                      "; check that --log-dir is writable");
  return buf.data();
}

}  // namespace

Agent::Agent(const Options& options, SignalChannel& signals, Watchdog& watchdog)
    : o_(options), signals_(signals), watchdog_(watchdog), host_(this_hostname()) {
  static const std::set<std::string> ours = {
      "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
      "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
      "TORCHELASTIC_ERROR_FILE", "DDPRUN_RDZV_ROUND", "DDPRUN_RECOVER_IN_PROCESS", "DDPRUN_REPLACEMENT",
      "DDPRUN_MIN_NODES"};
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!ours.count(kv.substr(0, kv.find('=')))) base_env_.push_back(kv);
  }
  // torchrun sets 1 when several workers share a node; ddprun splits the
  // cores instead, which keeps CPU-only workers from idling (docs/launcher.md).
  if (!std::getenv("OMP_NUM_THREADS")) {
    int threads = std::max(1, usable_cpus() / std::max(1, o_.nproc));
    omp_threads_ = std::to_string(threads);
  }
  // As torchrun 2.x: NCCL's asynchronous error handling, under the name
  // LibTorch 2.x reads. A worker on an older LibTorch (which reads
  // NCCL_ASYNC_ERROR_HANDLING, a name 2.x calls deprecated) gets the value
  // from libddp's init_process_group, which knows its LibTorch.
  if (!std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") && !std::getenv("NCCL_ASYNC_ERROR_HANDLING"))
    base_env_.push_back("TORCH_NCCL_ASYNC_ERROR_HANDLING=1");

  bool any_files = !o_.log_dir.empty();
  for (int lr = 0; lr < o_.nproc; ++lr) any_files = any_files || o_.redirects.of(lr) || o_.tee.of(lr);
  if (any_files) {
    std::string base = o_.log_dir;
    if (base.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      base = make_unique_dir(tmp && *tmp ? tmp : "/tmp", "ddprun_");
    }
    std::string id = o_.run_id;
    for (char& c : id)
      if (c == '/') c = '_';
    run_log_dir_ = make_unique_dir(base, id + "_");
  }
  // Every worker gets a TORCHELASTIC_ERROR_FILE of its own, log files or not
  // (torchrun keeps a temporary log directory for them; ddprun removes its
  // own when it exits).
  run_dir_ = run_log_dir_;
  if (run_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    try {
      run_dir_ = make_unique_dir(tmp && *tmp ? tmp : "/tmp", "ddprun_errors_");
      private_run_dir_ = true;
    } catch (const LaunchError& e) {
      say(std::string("cannot keep the workers' error files: ") + e.what() + "; set TMPDIR to a writable directory");
    }
  }
  if (const char* given = std::getenv("TORCHELASTIC_ERROR_FILE"); given && *given && !run_dir_.empty())
    say(std::string("TORCHELASTIC_ERROR_FILE=") + given + " is replaced by a file per worker, as torchrun does");
}

Agent::~Agent() {
  // Exceptions (lost store, exec failure) end here with workers running:
  // WorkerProcess's destructor SIGKILLs each group; orphans follow.
  workers_.clear();
  kill_adopted_orphans(watchdog_.pid());
  if (private_run_dir_) {
    std::error_code ec;
    fs::remove_all(run_dir_, ec);
  }
}

void Agent::tick() {
  for (int s : signals_.drain()) {
    if (s == SIGCHLD) {
      reap();
    } else if (SignalChannel::is_warning(s)) {
      say("received " + signal_name(s) + " while no worker runs; nothing to forward it to");
    } else {
      throw Interrupted(s);
    }
  }
}

void Agent::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    // Unknown pids are adopted orphans (ddprun is a child subreaper).
    for (auto& w : workers_)
      if (w.process && w.process->pid() == pid) {
        w.process->set_exit_status(status);
        w.exit_time = std::chrono::system_clock::now();
      }
  }
}

// ------------------------------------------------------------ the one loop

// Each state's handler does that state's work and names the next state; the
// states that wait for the workers first wait for output, exits, signals or
// the next check of the other nodes (wait_for_events).
int Agent::run(Rendezvous& rendezvous) {
  rdzv_ = &rendezvous;
  say_settings();
  for (;;) {
    switch (state_) {
      case State::Initial: state_ = start_workers(); break;
      case State::Healthy: state_ = monitor_workers(wait_for_events()); break;
      case State::Unhealthy: state_ = stop_workers(wait_for_events()); break;
      case State::Succeeded: state_ = exit_barrier(wait_for_events()); break;
      case State::Failed: state_ = restart_or_give_up(); break;
      case State::Stopped: state_ = stopped(); break;
      case State::Exited: return leave();
    }
  }
}

Agent::State Agent::start_workers() {
  const Assignment before = assignment_;
  assignment_ = rdzv_->join(round_, o_.nproc, [this] { tick(); });
  round_ = assignment_.round;
  lost_seen_ = -1;
  if (!before.nodes.empty()) {
    const std::string line = membership_change(before, assignment_, round_end_ ? round_end_->text : "a restart");
    if (!line.empty()) say(line);
  } else if (round_ > 0) {
    // This node arrived while the group ran, and the group restarted to let it in.
    say("joined run '" + o_.run_id + "' in round " + std::to_string(round_) + " as node " +
        std::to_string(assignment_.group_rank) + " of " + std::to_string(assignment_.num_nodes) + ", world size " +
        std::to_string(assignment_.world_size));
  }
  round_end_.reset();
  local_failures_.clear();
  stalled_.reset();
  killed_ = false;
  workers_.clear();
  workers_.resize(static_cast<size_t>(o_.nproc));
  std::string attempt_dir;
  if (!run_dir_.empty()) attempt_dir = run_dir_ + "/attempt_" + std::to_string(round_);
  if (assignment_.replacing)
    say("took the place of lost node " + std::to_string(assignment_.group_rank) + " in the running round " +
        std::to_string(round_) + "; its workers join the others at a step boundary (--recover-in-process)");
  for (int lr = 0; lr < o_.nproc; ++lr) {
    workers_[static_cast<size_t>(lr)].replacement = assignment_.replacing;
    try {
      start_worker(lr, attempt_dir);
    } catch (const LaunchError& e) {
      throw cannot_start(lr, e.what());
    }
  }
  next_poll_ = Clock::now() + seconds(o_.monitor_interval);
  return State::Healthy;
}

Agent::State Agent::monitor_workers(const Events& e) {
  if (e.signo) return forward_signal(e.signo);
  look_for_stopped();
  for (size_t i = 0; i < workers_.size(); ++i)
    if (failed(*workers_[i].process) && !workers_[i].reported) {
      workers_[i].reported = true;
      if (!lose_worker(workers_[i])) local_failures_.push_back(i);
    }
  if (!local_failures_.empty()) return stop_for_local_failure();
  if (o_.recover_in_process && !keep_recovering(e)) return stop_for_local_failure();
  if (all_exited()) {
    if (o_.recover_in_process) rdzv_->note_finished(finished_here());
    end_group();
    rdzv_->mark_done();
    next_poll_ = Clock::now();  // ask the other nodes at once
    return State::Succeeded;
  }
  if (failed_elsewhere(e, /*admit=*/true)) {
    say(std::string(round_end_->admits_nodes() ? "stopping the workers to let nodes join: "
                                               : "stopping the workers: ") +
        round_end_->text);
    // A node whose ddprun was told to stop passes its signal on.
    int f = round_end_->exit_code;
    begin_stop(round_end_->restartable ? SIGTERM : f > 128 ? f - 128 : SIGTERM);
    return State::Unhealthy;
  }
  return State::Healthy;
}

Agent::State Agent::forward_signal(int signo) {
  if (SignalChannel::is_warning(signo)) {
    say("received " + signal_name(signo) + "; forwarding it to the workers, which go on unless they stop");
    signal_running(signo);
    return State::Healthy;
  }
  // Forward what ddprun got to every worker; no restart follows.
  say("received " + signal_name(signo) + "; forwarding it to the workers");
  record_stop_signal(signo);
  begin_stop(signo);
  return State::Unhealthy;
}

Agent::State Agent::stop_for_local_failure() {
  const Worker& first = workers_[local_failures_.front()];
  const int code = exit_code_of(*first.process->exit_status());
  const auto error = read_error_file(first.error_file);
  // Not restarted: 75, the worker stopped for preemption with its state
  // saved (the job script requeues on it, and a restart here would only be
  // killed); a libddp program's refusal of its settings (exit 2 with a
  // ddp::UsageError, which guarded_main records), which a restart with the
  // same settings would only repeat.
  const bool refused_settings = code == 2 && error && error->message.rfind("ddp::UsageError: ", 0) == 0;
  RoundEnd r = RoundEnd::failure(code, code != ddp::kPreemptedExitCode && !refused_settings, failure_text(first));
  if (error) r.message = error->message;
  // A worker stopped meanwhile is why the others timed out: it is the cause.
  if ((stalled_ = first_stopped())) r.text = stalled_text(first);
  try {
    round_end_ = rdzv_->report_failure(r);
  } catch (const LaunchError& e) {
    // The other nodes cannot be told (a link or the store host is down);
    // they learn it from their own workers' timeouts. This node still
    // stops its workers and says why they failed.
    say(std::string(e.what()) + "; the other nodes are not told of this failure");
    round_end_ = r;
  }
  if (round_end_->admits_nodes()) {
    // Another node already stopped the group to admit waiting nodes; these
    // workers ended because their peers did (75: they checkpointed).
    say("stopping the workers to let nodes join: " + round_end_->text);
    begin_stop(SIGTERM);
    return State::Unhealthy;
  }
  if (code == ddp::kPreemptedExitCode) say("worker stopped for preemption (exit code 75); not restarting");
  if (refused_settings)
    say("worker refused its settings (exit code 2, ddp::UsageError); not restarting: a restart would refuse them "
        "again");
  say("worker " + r.text + "; stopping the other workers (SIGTERM, SIGKILL after " +
      std::to_string(static_cast<int>(o_.term_timeout)) + " s)");
  begin_stop(SIGTERM);
  return State::Unhealthy;
}

Agent::State Agent::stop_workers(const Events& e) {
  if (e.signo && SignalChannel::is_warning(e.signo)) {
    signal_running(e.signo);
  } else if (e.signo) {
    // A stop request while stopping: do not wait out the grace period.
    if (!stop_signal_) stop_signal_ = e.signo;
    kill_running();
  }
  if (all_exited()) {
    end_group();
    return stop_signal_ ? State::Stopped : State::Failed;
  }
  kill_stopped();
  if (!killed_ && Clock::now() >= kill_deadline_) {
    say("workers still running " + std::to_string(static_cast<int>(o_.term_timeout)) +
        " s after SIGTERM; sending SIGKILL (see --term-timeout)");
    kill_running();
  }
  return State::Unhealthy;
}

Agent::State Agent::exit_barrier(const Events& e) {
  if (e.signo && SignalChannel::is_warning(e.signo)) return State::Succeeded;  // no worker left to warn
  if (e.signo) {
    record_stop_signal(e.signo);
    return State::Stopped;
  }
  // Another node failed after ours finished: the group as a whole failed,
  // and a restart includes this node.
  if (failed_elsewhere(e, /*admit=*/false)) return State::Failed;
  if (e.poll_due && rdzv_->all_done()) {
    exit_code_ = 0;
    if (o_.recover_in_process && rdzv_->finished_anywhere() == 0) {
      say("every worker of the run failed or was lost (--recover-in-process)");
      exit_code_ = 1;
    }
    return State::Exited;
  }
  return State::Succeeded;
}

Agent::State Agent::restart_or_give_up() {
  if (round_end_ && round_end_->admits_nodes()) {
    // torchrun's rule: letting nodes in is no failure and costs no restart.
    say("restarting every worker to let nodes join (" + round_end_->text + "); not counted against --max-restarts");
    ++round_;
    return State::Initial;
  }
  bool restartable = round_end_ && round_end_->restartable;
  if (restartable && restarts_ < o_.max_restarts) {
    say("worker group failed (" + round_end_->text + "); restarting every worker, restart " +
        std::to_string(restarts_ + 1) + " of " + std::to_string(o_.max_restarts));
    ++restarts_;
    ++round_;
    return State::Initial;
  }
  print_summary();
  if (restartable && o_.max_restarts > 0)
    say("giving up after " + std::to_string(restarts_) + " restarts (--max-restarts " +
        std::to_string(o_.max_restarts) + ")");
  exit_code_ = round_end_ ? round_end_->exit_code : 1;
  return State::Exited;
}

Agent::State Agent::stopped() {
  // The first failure across all nodes, as for a failure: a node that srun
  // (--kill-on-bad-exit) or scancel stops after another node's worker failed
  // or stopped for preemption exits with that worker's code, so the job's
  // status is the rank's own and not 128+SIGTERM.
  exit_code_ = round_end_ ? round_end_->exit_code : 128 + stop_signal_;
  return State::Exited;
}

int Agent::leave() {
  // This node knows the outcome; the store's host waits for every node to
  // know it before the store goes away.
  rdzv_->acknowledge_end();
  try {
    rdzv_->finish([this] { tick(); });
  } catch (const Interrupted& e) {
    // Every worker has exited and the outcome is known: a stop now (srun
    // ending the step after another node failed) only cuts the wait short.
    say("received " + signal_name(e.signo()) + " while waiting for the other nodes to leave; exiting with " +
        std::to_string(exit_code_));
  }
  if (stop_signal_) say("stopped by " + signal_name(stop_signal_) + "; every worker has exited");
  return exit_code_;
}

// ------------------------------------------------ what the handlers share

void Agent::say_settings() const {
  if (!o_.nproc_how.empty()) say(o_.nproc_how);
  if (!run_log_dir_.empty()) say("worker logs in " + run_log_dir_);
  if (!omp_threads_.empty())
    say("setting OMP_NUM_THREADS=" + omp_threads_ + " for each worker (" + std::to_string(usable_cpus()) +
        " CPUs / " + std::to_string(o_.nproc) + " local workers); set OMP_NUM_THREADS yourself to override");
}

void Agent::start_worker(int lr, const std::string& attempt_dir) {
  Worker& w = workers_[static_cast<size_t>(lr)];
  w.local_rank = lr;
  w.rank = assignment_.rank_offset + lr;
  bool shown = !o_.local_ranks_filter || o_.local_ranks_filter->count(lr);
  int redirected = o_.redirects.of(lr);
  int teed = o_.tee.of(lr);
  UniqueFd out_file, err_file;
  w.stdout_log.clear();
  w.stderr_log.clear();
  w.error_file.clear();
  if (!attempt_dir.empty()) {
    std::string dir = attempt_dir + "/" + std::to_string(lr);
    std::error_code ec;
    fs::create_directories(dir, ec);
    // A file left by an earlier run must not pass for this worker's error.
    w.error_file = dir + "/error.json";
    fs::remove(w.error_file, ec);
  }
  if (!attempt_dir.empty() && !run_log_dir_.empty()) {
    std::string dir = attempt_dir + "/" + std::to_string(lr);
    // --log-dir keeps every stream; --tee/--redirects alone keep theirs.
    bool keep_all = !o_.log_dir.empty();
    if (keep_all || ((redirected | teed) & StdSpec::kOut)) {
      w.stdout_log = dir + "/stdout.log";
      out_file = open_log_file(w.stdout_log);
    }
    if (keep_all || ((redirected | teed) & StdSpec::kErr)) {
      w.stderr_log = dir + "/stderr.log";
      err_file = open_log_file(w.stderr_log);
    }
  }
  Pipe out = make_pipe(), err = make_pipe();
  WorkerSpec spec;
  spec.argv = o_.command;
  spec.env = worker_env(w);
  spec.signal_mask = &signals_.original_mask();
  w.process = std::make_unique<WorkerProcess>(spec, std::move(out.write), std::move(err.write));
  watchdog_.watch(w.process->pgid());
  std::string prefix = "[rank" + std::to_string(w.rank) + "]: ";
  output_.add(std::move(out.read), OutputRouter::Stream::Out, prefix,
              shown && !(redirected & StdSpec::kOut), std::move(out_file));
  output_.add(std::move(err.read), OutputRouter::Stream::Err, prefix,
              shown && !(redirected & StdSpec::kErr), std::move(err_file));
}

Agent::Events Agent::wait_for_events() {
  // Until the next check of the other nodes, or the end of the grace period.
  auto until = state_ == State::Unhealthy && !killed_ ? std::min(next_poll_, kill_deadline_) : next_poll_;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  output_.append_pollfds(fds);
  int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(ms, 0, 1000)));
  if (r > 0) {
    for (const auto& p : fds) {
      if (!p.revents) continue;
      if (p.fd == signals_.fd()) {
        for (int s : signals_.drain())
          if (s != SIGCHLD) pending_signals_.push_back(s);
      } else {
        output_.handle(p.fd);
      }
    }
  }
  reap();

  Events e;
  auto now = Clock::now();
  e.poll_due = now >= next_poll_;
  if (e.poll_due) next_poll_ = now + seconds(o_.monitor_interval);
  if (!pending_signals_.empty()) {
    e.signo = pending_signals_.front();
    pending_signals_.erase(pending_signals_.begin());
  }
  return e;
}

LaunchError Agent::cannot_start(int local_rank, const std::string& why) {
  // A half-started group must not run: the started workers go now (their
  // process groups, SIGKILL), the other nodes hear of it, and ddprun exits 1.
  workers_.clear();
  kill_adopted_orphans(watchdog_.pid());
  const std::string text = "ddprun on host " + host_ + " could not start local rank " + std::to_string(local_rank) +
                           " of " + std::to_string(o_.nproc) + ": " + why;
  try {
    rdzv_->report_failure(RoundEnd::failure(kExitLaunch, false, text));
  } catch (const LaunchError&) {
    // The store is gone too; this node exits all the same.
  }
  return LaunchError("cannot start worker " + std::to_string(local_rank) + " of " + std::to_string(o_.nproc) +
                     " on this node: " + why +
                     (local_rank > 0 ? "; stopped the " + std::to_string(local_rank) +
                                           " already started; lower --nproc-per-node"
                                     : ""));
}

void Agent::record_stop_signal(int signo) {
  stop_signal_ = signo;
  RoundEnd r = RoundEnd::failure(128 + signo, false, "ddprun on host " + host_ + " received " + signal_name(signo));
  try {
    round_end_ = rdzv_->report_failure(r);
  } catch (const LaunchError&) {
    round_end_ = r;  // the store is gone: this node stops all the same
  }
}

bool Agent::failed_elsewhere(const Events& e, bool admit) {
  if (!e.poll_due) return false;
  std::optional<RoundEnd> f;
  try {
    f = rdzv_->poll(admit);
  } catch (const LaunchError& lost) {
    // The link to the store host, or that host, is down: the workers cannot
    // reach their peers either. Stop them (restartable: a restart rejoins
    // once the link is back) rather than wait out their own timeouts.
    f = RoundEnd::failure(1, true, lost.what());
  }
  if (f) round_end_ = *f;
  return f.has_value();
}

bool Agent::all_exited() const {
  for (const auto& w : workers_)
    if (!w.process->exited()) return false;
  return true;
}

void Agent::signal_running(int signo) {
  for (auto& w : workers_)
    if (w.process && !w.process->exited()) w.process->signal_group(signo);
}

void Agent::kill_running() {
  signal_running(SIGKILL);
  killed_ = true;
}

void Agent::begin_stop(int signo) {
  kill_deadline_ = Clock::now() + seconds(o_.term_timeout);
  kill_stopped();
  if (o_.term_timeout > 0)
    signal_running(signo);
  else
    kill_running();
}

void Agent::end_group() {
  // Every worker has exited; whatever they started must not outlive them:
  // their process groups, then children that left the group (re-parented
  // to ddprun). Then the pipes reach EOF and the last lines come out.
  for (auto& w : workers_)
    if (w.process) {
      w.process->signal_group(SIGKILL);
      watchdog_.unwatch(w.process->pgid());
    }
  kill_adopted_orphans(watchdog_.pid());
  output_.drain(Clock::now() + std::chrono::seconds(2));
  output_.close_all();
}

std::vector<std::string> Agent::worker_env(const Worker& w) const {
  std::vector<std::string> env = base_env_;
  auto put = [&](const std::string& k, const std::string& v) { env.push_back(k + "=" + v); };
  const Assignment& a = assignment_;
  put("LOCAL_RANK", std::to_string(w.local_rank));
  put("RANK", std::to_string(w.rank));
  put("GROUP_RANK", std::to_string(a.group_rank));
  put("ROLE_RANK", std::to_string(w.rank));
  put("ROLE_NAME", o_.role);
  put("LOCAL_WORLD_SIZE", std::to_string(o_.nproc));
  put("WORLD_SIZE", std::to_string(a.world_size));
  put("GROUP_WORLD_SIZE", std::to_string(a.num_nodes));
  put("ROLE_WORLD_SIZE", std::to_string(a.world_size));
  // --recover-in-process: the workers meet on ddprun's store, which outlives
  // any of them (torchrun's agent store), each round's keys under a prefix.
  const bool agent_store = o_.recover_in_process;
  put("MASTER_ADDR", agent_store ? a.store_host : a.master_addr);
  put("MASTER_PORT", std::to_string(agent_store ? a.store_port : a.master_port));
  put("TORCHELASTIC_RESTART_COUNT", std::to_string(restarts_));
  // Every re-rendezvous, membership changes included (torchrun's restart
  // count leaves those out): what tells a restarted program to resume.
  put("DDPRUN_RDZV_ROUND", std::to_string(round_));
  put("TORCHELASTIC_MAX_RESTARTS", std::to_string(o_.max_restarts));
  put("TORCHELASTIC_RUN_ID", o_.run_id);
  if (agent_store) {
    put("TORCHELASTIC_USE_AGENT_STORE", "True");
    put("DDPRUN_RECOVER_IN_PROCESS", "1");
    // --nnodes' minimum: below it the group does not re-form (the kit saves a checkpoint and exits 75).
    put("DDPRUN_MIN_NODES", std::to_string(o_.min_nodes));
  } else {
    // The workers' rank 0 serves its own store at MASTER_PORT; ddprun's store
    // (several nodes) lives elsewhere.
    put("TORCHELASTIC_USE_AGENT_STORE", "False");
  }
  if (w.replacement) put("DDPRUN_REPLACEMENT", "1");  // --recover-in-process: it joins the others
  if (!omp_threads_.empty()) put("OMP_NUM_THREADS", omp_threads_);
  if (!w.error_file.empty()) put("TORCHELASTIC_ERROR_FILE", w.error_file);
  return env;
}

std::string Agent::failure_text(const Worker& w) const {
  return "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + ") on host " + host_ +
         ": " + describe_status(*w.process->exit_status());
}

}  // namespace ddprun
