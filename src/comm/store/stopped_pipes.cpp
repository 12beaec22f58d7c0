// The interposed pipe() and this thread's StoppedPipes (stopped_pipes.h).
// The symbol replaces the C library's when it is found first: in the
// executable, or in libddp linked before libc.
#include "comm/store/stopped_pipes.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace ddp::stopped_pipes {
namespace {

// The innermost StoppedPipes' count. In ddprun, its store module constructs
// StoppedPipes through the executable's exports, so this is the executable's.
thread_local int* t_made = nullptr;

}  // namespace

StoppedPipes::StoppedPipes() : outer_(t_made) { t_made = &made_; }

StoppedPipes::~StoppedPipes() { t_made = outer_; }

}  // namespace ddp::stopped_pipes

#ifdef DDP_INTERPOSE_PIPE
// Not in any namespace: it replaces the C library's for this process.
extern "C" int pipe(int fds[2]) noexcept {
  const int rc = static_cast<int>(::syscall(SYS_pipe2, fds, 0));
  if (int* made = ddp::stopped_pipes::t_made; rc == 0 && made) {
    const char stop = 0;
    const int saved = errno;
    while (::write(fds[1], &stop, 1) < 0 && errno == EINTR) {
    }
    errno = saved;
    ++*made;
  }
  return rc;
}
#endif  // DDP_INTERPOSE_PIPE
