// The agent: owns this node's worker group and runs the one monitor loop.
//
// Group states (torchrun's WorkerState). run() is a loop that hands the
// current state to its handler, and the handler returns the next state:
//   Initial    start_workers: rendezvous, then start the workers  -> Healthy
//   Healthy    monitor_workers: a worker failed, ddprun got a signal,
//              another node failed, or nodes wait to join: SIGTERM
//              (or that signal) to every worker                    -> Unhealthy
//              every worker exited 0                               -> Succeeded
//   Unhealthy  stop_workers: SIGKILL after --term-timeout, or at once
//              on a further signal, or to a stopped worker (it cannot
//              handle SIGTERM); when every worker has exited       -> Failed,
//              or Stopped if ddprun got a signal
//   Succeeded  exit_barrier: wait for the other nodes' workers      -> Exited (0)
//              another node failed                                 -> Failed
//              ddprun got a signal                                 -> Stopped
//   Failed     restart_or_give_up: while --max-restarts allows     -> Initial
//              (restart count + 1); else print the failure summary -> Exited
//              (the first failing worker's exit code); a membership
//              change (c10d: nodes wait to join) restarts uncounted -> Initial
//   Stopped    stopped: ddprun got SIGINT/SIGTERM/...              -> Exited (128+sig)
//   Exited     leave: tell the store this node knows the outcome,
//              wait (store host) until every node does, return the exit code
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "errors.h"
#include "output.h"
#include "rendezvous.h"
#include "signals.h"
#include "stopped_workers.h"
#include "watchdog.h"
#include "worker_process.h"

namespace ddprun {

class Agent {
 public:
  Agent(const Options& options, SignalChannel& signals, Watchdog& watchdog);
  ~Agent();

  // Runs to the end and returns ddprun's exit code. Throws LaunchError or
  // Interrupted (from a rendezvous); the workers are gone by then either way.
  int run(Rendezvous& rendezvous);

  // Reads pending signals; throws Interrupted for a stop signal. Rendezvous
  // waits call it so Ctrl-C works while nodes are still gathering.
  void tick();

 private:
  enum class State { Initial, Healthy, Unhealthy, Failed, Succeeded, Stopped, Exited };
  using Clock = std::chrono::steady_clock;

  struct Worker {
    int local_rank = 0;
    int rank = 0;
    std::unique_ptr<WorkerProcess> process;
    std::string stdout_log, stderr_log;
    std::string error_file;  // its TORCHELASTIC_ERROR_FILE
    std::chrono::system_clock::time_point exit_time;
    bool reported = false;  // counted as a failure already
    bool lost = false;      // --recover-in-process: failed, and the others went on without it
    bool replacement = false;  // --recover-in-process: started in place of a lost one
    bool taken_in = false;     // a replacement the others took in (it removed its predecessor's lost/ key)
    StopWatch stop;         // stopped (SIGSTOP, a debugger), and since when
    bool killed_stopped = false;
  };

  // What one wait of the monitor loop brought.
  struct Events {
    int signo = 0;          // a signal to ddprun (SIGINT, SIGTERM, ...), or 0
    bool poll_due = false;  // time to check the other nodes (--monitor-interval)
  };

  // One handler per state; each returns the next state.
  State start_workers();
  State monitor_workers(const Events& e);
  State stop_workers(const Events& e);
  State exit_barrier(const Events& e);
  State restart_or_give_up();
  State stopped();
  int leave();

  // monitor_workers' steps: a signal to ddprun goes on to the workers; a
  // worker of this node failed (the failure is reported to the other nodes).
  State forward_signal(int signo);
  State stop_for_local_failure();

  // What the handlers share.
  void say_settings() const;
  void start_worker(int local_rank, const std::string& attempt_dir);
  Events wait_for_events();
  void reap();
  void record_stop_signal(int signo);
  // Worker `local_rank` could not be started (fork failed: EAGAIN at the
  // process limit): stops the started ones, tells the other nodes, and
  // returns the error ddprun exits with.
  LaunchError cannot_start(int local_rank, const std::string& why);
  // From the monitor loop: another node failed, or (`admit`: this node's
  // workers run healthy) nodes wait to join; sets round_end_.
  bool failed_elsewhere(const Events& e, bool admit);
  bool all_exited() const;
  bool lose_worker(Worker& w);
  bool keep_recovering(const Events& e);
  void end_declared_lost();
  void leave_stopped_behind();
  void replace(Worker& w);
  void end_waiting_replacements();
  int finished_here() const;
  void signal_running(int signo);
  void kill_running();
  void begin_stop(int signo);
  // Stopped workers (stopped_workers.h; agent_stopped.cpp): noted on every
  // pass, named as the root cause when the group fails, SIGKILLed at once
  // when it stops.
  void look_for_stopped();
  std::optional<size_t> first_stopped() const;
  void kill_stopped();
  void end_group();
  std::vector<std::string> worker_env(const Worker& w) const;
  std::string failure_text(const Worker& w) const;
  // The failure's text when stalled_ is set: the stopped rank, then `first`.
  std::string stalled_text(const Worker& first) const;
  void print_summary() const;
  // print_summary's parts (agent_summary.cpp): one worker's block (its time,
  // rank, exit code, logs and error file), and the section on the cause.
  std::string summary_block(const Worker& w, bool failure = true) const;
  std::string preemption_section(bool root_here) const;
  std::string root_cause_section(bool root_here, bool stalled_here) const;

  Options o_;
  SignalChannel& signals_;
  Watchdog& watchdog_;
  Rendezvous* rdzv_ = nullptr;
  State state_ = State::Initial;
  int round_ = 0;     // the rendezvous round: every restart, membership changes included
  int restarts_ = 0;  // restarts after failures (TORCHELASTIC_RESTART_COUNT, --max-restarts)
  int64_t lost_seen_ = -1;  // --recover-in-process: the round's lost count at the last look
  Assignment assignment_;
  std::vector<Worker> workers_;
  OutputRouter output_;
  std::vector<int> pending_signals_;
  int stop_signal_ = 0;
  // How this round ended, as every node follows it (the first node's
  // report): a failure, or nodes waiting to be admitted.
  std::optional<RoundEnd> round_end_;
  int exit_code_ = 0;
  std::vector<size_t> local_failures_;
  std::optional<size_t> stalled_;  // the stopped worker named as the root cause
  Clock::time_point kill_deadline_{};
  bool killed_ = false;
  Clock::time_point next_poll_{};
  std::vector<std::string> base_env_;
  std::string omp_threads_;
  std::string run_log_dir_;
  // Where attempt_N/LOCAL_RANK/error.json go: run_log_dir_, or without log
  // files a private temporary directory that the destructor removes.
  std::string run_dir_;
  bool private_run_dir_ = false;
  std::string host_;
};

}  // namespace ddprun
