#include "watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "errors.h"

namespace ddprun {
namespace {

// The guardian's whole life. Async-signal-safe calls and a fixed array only:
// it is a fork of a process that may later have threads (not yet, but the
// loop stays safe regardless).
[[noreturn]] void guardian(int from_launcher) {
  // Ctrl-C reaches the launcher's whole process group, the guardian included;
  // it must outlive the launcher, so it ignores every stop request.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::sigaction(s, &ign, nullptr);
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    // Holding the launcher's stdout open would delay EOF for whoever reads it.
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  constexpr int kMax = 8192;
  static pid_t groups[kMax];
  int n = 0;
  int32_t msg;
  for (;;) {
    ssize_t r = ::read(from_launcher, &msg, sizeof msg);
    if (r < 0 && errno == EINTR) continue;
    if (r != static_cast<ssize_t>(sizeof msg)) break;  // EOF: the launcher is gone
    if (msg > 0 && n < kMax) {
      groups[n++] = msg;
    } else if (msg < 0) {
      for (int i = 0; i < n; ++i)
        if (groups[i] == -msg) {
          groups[i] = groups[--n];
          break;
        }
    }
  }
  for (int i = 0; i < n; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

}  // namespace

Watchdog::Watchdog() {
  Pipe p = make_pipe();
  pid_ = ::fork();
  if (pid_ < 0) throw LaunchError(std::string("cannot fork the watchdog: ") + std::strerror(errno));
  if (pid_ == 0) {
    p.write.reset();
    guardian(p.read.get());
  }
  to_guardian_ = std::move(p.write);
}

Watchdog::~Watchdog() {
  to_guardian_.reset();
  if (pid_ > 0) {
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void Watchdog::watch(pid_t pgid) {
  int32_t msg = pgid;
  write_all(to_guardian_.get(), reinterpret_cast<const char*>(&msg), sizeof msg);
}

void Watchdog::unwatch(pid_t pgid) {
  int32_t msg = -pgid;
  write_all(to_guardian_.get(), reinterpret_cast<const char*>(&msg), sizeof msg);
}

}  // namespace ddprun
