// The agent: owns this node's worker group and runs the one monitor loop.
//
// Group states (torchrun's WorkerState):
//   Initial    rendezvous, then start the workers          -> Healthy
//   Healthy    workers running; a failure, a signal to ddprun or another
//              node's failure                               -> Unhealthy
//              every worker exited 0                        -> Succeeded
//   Unhealthy  stopping: SIGTERM sent, SIGKILL after --term-timeout
//                                                           -> Failed/Stopped
//   Failed     restart (Initial, count + 1) while --max-restarts allows,
//              else print the failure summary and exit with the first
//              failing worker's exit code
//   Succeeded  waiting for the other nodes (exit barrier)   -> exit 0
//   Stopped    ddprun got SIGINT/SIGTERM/...                -> exit 128+sig
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "output.h"
#include "rendezvous.h"
#include "signals.h"
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
  enum class State { Initial, Healthy, Unhealthy, Failed, Succeeded, Stopped };
  using Clock = std::chrono::steady_clock;

  struct Worker {
    int local_rank = 0;
    int rank = 0;
    std::unique_ptr<WorkerProcess> process;
    std::string stdout_log, stderr_log;
    std::chrono::system_clock::time_point exit_time;
    bool reported = false;  // counted as a failure already
  };

  void start_group();
  void wait_for_events(Clock::duration timeout);
  void reap();
  void begin_stop(int signo);
  void end_group();
  std::vector<std::string> worker_env(const Worker& w) const;
  std::string failure_text(const Worker& w) const;
  void print_summary() const;
  static const char* state_name(State s);

  Options o_;
  SignalChannel& signals_;
  Watchdog& watchdog_;
  Rendezvous* rdzv_ = nullptr;
  State state_ = State::Initial;
  int round_ = 0;
  Assignment assignment_;
  std::vector<Worker> workers_;
  OutputRouter output_;
  std::vector<int> pending_signals_;
  int stop_signal_ = 0;
  std::optional<FailureRecord> failure_;
  std::vector<size_t> local_failures_;
  Clock::time_point kill_deadline_{};
  bool killed_ = false;
  Clock::time_point next_poll_{};
  std::vector<std::string> base_env_;
  std::string omp_threads_;
  std::string run_log_dir_;
  std::string host_;
};

}  // namespace ddprun
