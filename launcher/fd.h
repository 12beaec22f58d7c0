// RAII for file descriptors and pipes, and a write loop that survives EINTR
// and short writes. Every fd the launcher opens is close-on-exec so workers
// inherit exactly stdin, their own stdout/stderr pipes and nothing else.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace ddprun {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

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
