// The guarantee that workers die with ddprun even when ddprun cannot clean
// up (SIGKILL, OOM killer, crash). PR_SET_PDEATHSIG kills each worker, but not
// the worker's own children; so a tiny guardian process, forked before any
// thread exists, keeps the list of worker process groups and SIGKILLs every
// one of them the moment ddprun's end of a pipe closes.
#pragma once

#include <sys/types.h>

#include "fd.h"

namespace ddprun {

class Watchdog {
 public:
  // Forks the guardian. Call early in main(), after SignalChannel and before
  // anything that may start threads.
  Watchdog();
  // Closes the pipe (the guardian kills what is still listed and exits) and
  // reaps the guardian.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void watch(pid_t pgid);
  void unwatch(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  UniqueFd to_guardian_;
};

}  // namespace ddprun
