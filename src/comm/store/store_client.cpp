#include "comm/store/store_client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "comm/c10d_compat.h"
#include "comm/store/store_deadline.h"
#include "comm/store/stopped_pipes.h"

namespace ddp::store_client {
namespace {

// Where pipe() is not interposed (stopped_pipes.h), ends 1.13's watchKey()
// thread after the construction as its destructor would: one byte on its
// control pipe, the only pipe the construction opened, and the thread
// leaves its loop; the destructor's own byte and join still work. Another
// thread's pipe made meanwhile would make two: then nothing is written. A
// reset arriving before the byte still ends the process: the interposed
// pipe() leaves no such moment.
void stop_callback_thread(const store_deadline::Sockets& pipes_before) {
  const auto made = store_deadline::opened_since(pipes_before, "pipe:");
  int write_end = -1;
  int writes = 0;
  for (int fd : made) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags != -1 && (flags & O_ACCMODE) == O_WRONLY) {
      write_end = fd;
      ++writes;
    }
  }
  if (writes != 1 || made.size() != 2) return;
  const char byte = 0;
  while (::write(write_end, &byte, 1) < 0 && errno == EINTR) {
  }
}

}  // namespace

Connection connect(const std::string& host, const c10d::TCPStoreOptions& opts, std::chrono::milliseconds within,
                   const std::function<bool()>& stop) {
  const auto before = store_deadline::sockets_now();
  const auto pipes_before = store_deadline::fds_now("pipe:");
  auto construct = opts;
  // c10d's own connect-and-retry loop ends here too; the Deadline ends a
  // ping (2.x) that a silent server never answers.
  construct.timeout = within;
  Connection out;
  int stopped = 0;
  {
    store_deadline::Deadline deadline(store_deadline::Clock::now() + within, {}, stop);
    std::optional<stopped_pipes::StoppedPipes> stopping;
    if (compat::kStoreClientHasCallbackThread) stopping.emplace();
    out.store = c10::make_intrusive<c10d::TCPStore>(host, construct);
    if (stopping) stopped = stopping->made();
    if (deadline.ended() != store_deadline::Ended::No) {
      // Constructed just as the deadline shut its sockets down: unusable.
      throw std::runtime_error("no answer from the store at " + host + ":" + std::to_string(opts.port) +
                               " while connecting");
    }
  }
  if (compat::kStoreClientHasCallbackThread && stopped == 0) stop_callback_thread(pipes_before);
  out.store->setTimeout(opts.timeout);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(opts.timeout).count();
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  out.sockets = store_deadline::opened_since(before);
  for (int fd : out.sockets) {
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  return out;
}

c10::intrusive_ptr<c10d::TCPStore> connect_bounded(const std::string& host, const c10d::TCPStoreOptions& opts) {
  return connect(host, opts, opts.timeout).store;
}

}  // namespace ddp::store_client
