// The launcher's signals arrive through a signalfd instead of handlers, so
// the one monitor loop sees them in poll() next to the worker pipes and acts
// on them in ordinary code (no async-signal-safety puzzles, no lost SIGCHLD).
#pragma once

#include <signal.h>

#include <vector>

#include "fd.h"

namespace ddprun {

class SignalChannel {
 public:
  // Blocks SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 (Slurm's usual
  // preemption warnings, forwarded as torchrun's --signals-to-handle) and
  // SIGCHLD, and ignores SIGPIPE.
  // Construct it first thing in main(): threads started later (TCPStore,
  // libcuda) inherit the mask, so no signal can land on them and kill ddprun.
  SignalChannel();
  ~SignalChannel();
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;

  int fd() const { return fd_.get(); }

  // The signals that arrived since the last call (non-blocking).
  std::vector<int> drain();

  // The mask ddprun was started with; workers get it back before exec.
  const sigset_t& original_mask() const { return original_mask_; }

  // SIGUSR1 and SIGUSR2: a warning for the workers (Slurm's preemption
  // notice), forwarded to them while ddprun goes on supervising; the workers
  // decide whether to stop (checkpoint and exit 75, say).
  static bool is_warning(int signo) { return signo == SIGUSR1 || signo == SIGUSR2; }
  // Whether a termination signal waits in the channel, unread: safe from any
  // thread, and reads nothing (store_deadline.h's helper thread asks it, so a
  // store call blocked on a silent host ends on Ctrl-C; tick() then reads it).
  static bool termination_pending();

 private:
  sigset_t original_mask_{};
  struct sigaction original_sigpipe_{};
  UniqueFd fd_;
};

}  // namespace ddprun
