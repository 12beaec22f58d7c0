#include "signals.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "errors.h"

namespace ddprun {

SignalChannel::SignalChannel() {
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD}) sigaddset(&handled, s);
  if (::pthread_sigmask(SIG_BLOCK, &handled, &original_mask_) != 0)
    throw LaunchError("cannot block signals");
  // A closed console (ddprun ... | head) must not kill the supervisor: writes
  // fail with EPIPE instead and workers keep being supervised.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &original_sigpipe_);
  int fd = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) throw LaunchError(std::string("cannot create a signalfd: ") + std::strerror(errno));
  fd_.reset(fd);
}

SignalChannel::~SignalChannel() {
  fd_.reset();
  ::sigaction(SIGPIPE, &original_sigpipe_, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &original_mask_, nullptr);
}

bool SignalChannel::termination_pending() {
  sigset_t pending;
  sigemptyset(&pending);
  if (::sigpending(&pending) != 0) return false;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    if (sigismember(&pending, s) == 1) return true;
  return false;
}

std::vector<int> SignalChannel::drain() {
  std::vector<int> out;
  signalfd_siginfo info;
  for (;;) {
    ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) {
      out.push_back(static_cast<int>(info.ssi_signo));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  return out;
}

}  // namespace ddprun
