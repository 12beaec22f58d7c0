#include "output.h"

#include <unistd.h>

#include <cerrno>

namespace ddprun {
namespace {

// A line longer than this is cut into pieces of this size, each printed as
// a whole line: memory stays bounded even if a worker never prints '\n'.
constexpr size_t kMaxLine = 1 << 20;

int console_fd(OutputRouter::Stream s) { return s == OutputRouter::Stream::Out ? 1 : 2; }

}  // namespace

void say(const std::string& message) { write_all(2, "ddprun: " + message + "\n"); }

void OutputRouter::add(UniqueFd pipe_read, Stream stream, std::string prefix, bool console, UniqueFd file) {
  set_nonblocking(pipe_read.get());
  sources_.push_back(Source{std::move(pipe_read), stream, std::move(prefix), console, std::move(file), {}});
}

void OutputRouter::append_pollfds(std::vector<pollfd>& fds) const {
  for (const auto& s : sources_)
    if (s.fd) fds.push_back(pollfd{s.fd.get(), POLLIN, 0});
}

bool OutputRouter::handle(int fd) {
  for (auto& s : sources_)
    if (s.fd && s.fd.get() == fd) {
      read_some(s);
      return true;
    }
  return false;
}

void OutputRouter::read_some(Source& s) {
  char buf[65536];
  ssize_t n = ::read(s.fd.get(), buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // EOF (or a broken pipe): the stream is over
    flush_partial(s);
    s.fd.reset();
    return;
  }
  if (s.file) write_all(s.file.get(), buf, static_cast<size_t>(n));
  if (!s.console) return;
  s.partial.append(buf, static_cast<size_t>(n));
  // Every complete line goes out in one write(): a reader of ddprun's
  // output sees whole lines, each with its worker's prefix.
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) {
      if (s.partial.size() - start < kMaxLine) break;
      nl = start + kMaxLine - 1;  // an endless line: emit a piece as a line
      out += s.prefix;
      out.append(s.partial, start, nl - start + 1);
      out += '\n';
    } else {
      out += s.prefix;
      out.append(s.partial, start, nl - start + 1);
    }
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (!out.empty()) write_all(console_fd(s.stream), out);
}

void OutputRouter::flush_partial(Source& s) {
  if (!s.console || s.partial.empty()) return;
  write_all(console_fd(s.stream), s.prefix + s.partial + "\n");
  s.partial.clear();
}

void OutputRouter::drain(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    std::vector<pollfd> fds;
    append_pollfds(fds);
    if (fds.empty()) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) return;
    for (const auto& p : fds)
      if (p.revents) handle(p.fd);
  }
}

void OutputRouter::close_all() {
  for (auto& s : sources_) flush_partial(s);
  sources_.clear();
}

}  // namespace ddprun
