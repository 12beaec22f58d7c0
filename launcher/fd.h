// RAII for file descriptors and pipes, and a write loop that survives EINTR
// and short writes. Every fd the launcher opens is close-on-exec so workers
// inherit exactly stdin, their own stdout/stderr pipes and nothing else.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/unique_fd.h"

namespace ddprun {

using ddp::UniqueFd;

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// A close-on-exec pipe; throws LaunchError (out of fds, typically).
Pipe make_pipe();

void set_nonblocking(int fd);

// Writes all of [data, data+size); retries on EINTR/EAGAIN. Returns false if
// the reader went away (EPIPE) or another error happened: console output
// that nobody reads must not stop the launcher from supervising.
bool write_all(int fd, const char* data, size_t size);
inline bool write_all(int fd, const std::string& s) { return write_all(fd, s.data(), s.size()); }

// Opens (creating or truncating) a log file, close-on-exec. Throws LaunchError.
UniqueFd open_log_file(const std::string& path);

}  // namespace ddprun
