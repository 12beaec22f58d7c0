#include "fd.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "errors.h"

namespace ddprun {

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw LaunchError(std::string("cannot create a pipe: ") + std::strerror(errno) +
                      "; raise the open-file limit (ulimit -n)");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      // The console may be a non-blocking fd shared with others; wait for room.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

UniqueFd open_log_file(const std::string& path) {
  // Never through a link planted where a log goes.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw LaunchError("cannot open log file " + path + ": " + std::strerror(errno) +
                      (errno == ELOOP ? "; it is a symbolic link, which ddprun never writes through: remove it"
                                      : "; check that --log-dir is writable"));
  return UniqueFd(fd);
}

}  // namespace ddprun
