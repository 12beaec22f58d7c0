#include "worker_process.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace ddprun {
namespace {

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

[[noreturn]] void child_fail(int err_fd, int err) {
  int32_t e = err;
  ssize_t ignored = ::write(err_fd, &e, sizeof e);
  (void)ignored;
  ::_exit(127);
}

// Runs in the forked child: only async-signal-safe calls, every buffer was
// prepared by the parent (the launcher may have threads, e.g. TCPStore's).
[[noreturn]] void child_exec(pid_t parent, const char* path, char* const* argv, char* const* envp, int out_fd,
                             int err_fd, int report_fd, const sigset_t* mask) {
  // Own process group: the launcher can signal the worker and everything
  // it starts at once, and Ctrl-C on the terminal reaches only the launcher,
  // which forwards it (torchrun's behaviour).
  ::setpgid(0, 0);
  // Die with the launcher, even if it is SIGKILLed; then close the race
  // where the launcher died before prctl ran.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::sigaction(s, &dfl, nullptr);
  if (mask) ::sigprocmask(SIG_SETMASK, mask, nullptr);
  if (::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) child_fail(report_fd, errno);
  // Everything above stdin/stdout/stderr closes at exec (store sockets,
  // other workers' pipes); like Python's subprocess close_fds=True.
  ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execve(path, argv, envp);
  child_fail(report_fd, errno);
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

WorkerProcess::WorkerProcess(const WorkerSpec& spec, UniqueFd stdout_w, UniqueFd stderr_w) {
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  Pipe report = make_pipe();
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    const int err = errno;
    throw LaunchError(std::string("cannot fork a worker: ") + std::strerror(err) +
                      (err == EAGAIN ? " (the limit on processes and threads: ulimit -u, a cgroup's pids.max, "
                                       "kernel.threads-max)"
                                     : ""));
  }
  if (pid_ == 0)
    child_exec(parent, argv[0], argv.data(), envp.data(), stdout_w.get(), stderr_w.get(), report.write.get(),
               spec.signal_mask);
  // Both sides call setpgid so the group exists before the parent signals it.
  ::setpgid(pid_, pid_);
  report.write.reset();
  int32_t err = 0;
  ssize_t n;
  while ((n = ::read(report.read.get(), &err, sizeof err)) < 0 && errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof err)) {
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    throw LaunchError("cannot execute " + spec.argv[0] + ": " + std::strerror(err));
  }
}

WorkerProcess::~WorkerProcess() {
  if (pid_ <= 0) return;
  // Whatever is still in the group goes, even if the worker itself exited.
  ::kill(-pid_, SIGKILL);
  if (!status_) {
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void WorkerProcess::signal_group(int signo) const {
  if (pid_ > 0) ::kill(-pid_, signo);
}

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")";
  return "status " + std::to_string(status);
}

void kill_adopted_orphans(pid_t keep) {
  pid_t self = ::getpid();
  // Killing one orphan can orphan its children in turn: repeat until none.
  for (int round = 0; round < 20; ++round) {
    std::vector<pid_t> found;
    if (DIR* d = ::opendir("/proc")) {
      while (dirent* e = ::readdir(d)) {
        pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
        if (pid <= 0 || pid == keep) continue;
        std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        // Fields after the parenthesised command: state, ppid, ...
        size_t close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 2));
        char state;
        pid_t ppid;
        if (rest >> state >> ppid && ppid == self) found.push_back(pid);
      }
      ::closedir(d);
    }
    if (found.empty()) return;
    for (pid_t pid : found) ::kill(pid, SIGKILL);
    for (pid_t pid : found) {
      int status;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

}  // namespace ddprun
