// One worker: a child process in its own process group, started with
// fork + execve from argv/env vectors (never a shell string), owned by this
// object. Destroying it kills the whole group (grandchildren included) and
// reaps the worker, so no exit path of the launcher leaves a worker behind.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "fd.h"

namespace ddprun {

struct WorkerSpec {
  std::vector<std::string> argv;  // argv[0] is the resolved executable path
  std::vector<std::string> env;   // complete environment, NAME=VALUE
  const sigset_t* signal_mask = nullptr;  // restored in the child before exec
};

class WorkerProcess {
 public:
  // Starts the worker with stdout/stderr connected to the given pipe ends.
  // Throws LaunchError if fork or exec fails (exec errors come back through
  // a close-on-exec pipe, so "exec failed" is never mistaken for a worker).
  WorkerProcess(const WorkerSpec& spec, UniqueFd stdout_w, UniqueFd stderr_w);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The process group is the worker's pid (setpgid(0, 0) in the child).
  pid_t pgid() const { return pid_; }

  // Signals every process in the worker's group; harmless once it is gone.
  void signal_group(int signo) const;

  // The agent reaps all children with waitpid(-1) and hands the status over.
  void set_exit_status(int status) { status_ = status; }
  bool exited() const { return status_.has_value(); }
  const std::optional<int>& exit_status() const { return status_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Exit code as a shell reports it: the code, or 128 + signal.
int exit_code_of(int wait_status);
// "exit code 3" or "signal 9 (SIGKILL)".
std::string describe_status(int wait_status);
std::string signal_name(int signo);

// SIGKILLs and reaps every child of this process except `keep` (the watchdog):
// grandchildren that left their worker's process group (setsid) are
// re-parented to ddprun, a child subreaper, and end here.
void kill_adopted_orphans(pid_t keep);

}  // namespace ddprun
