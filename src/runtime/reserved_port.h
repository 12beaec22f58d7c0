// A TCP port reserved for the rest of this process's life, to hand to a
// child (or a store of one's own) that will listen on it: two processes that
// reserve ports at once (ctest -j, two ddpruns) never draw the same one, and
// nothing else takes it before the child listens. Used by ddprun
// (launcher/net.cpp) and the tests (tests/support/reserved_port.h).
//
// reserve_port() binds a socket to INADDR_ANY, port 0, without SO_REUSEADDR,
// so the kernel hands out a port that no socket holds, on any address; then
// sets SO_REUSEADDR on that socket and keeps it open, bound and not
// listening, until the process exits (close-on-exec: children do not
// inherit it). While it is held, on Linux:
//   - no outgoing connect() and no bind() to port 0 of any process draws the
//     port (the kernel skips a port that a bound socket holds), except a
//     bind() of an IPv6 socket that takes no IPv4 (IPV6_V6ONLY, or bound to
//     one IPv6 address), which could share the port without stopping an IPv4
//     or dual-stack listener's bind;
//   - a bind() without SO_REUSEADDR to it fails, on any IPv4 address;
//   - a bind() to it, on any address, by a socket that sets SO_REUSEADDR
//     succeeds, and so does its listen(), because the holder does not listen.
//     Everything that listens on a reserved port sets it: c10d's
//     TCPStore (its classic server and libuv's uv_tcp_bind), libddp's store
//     (src/comm/store/store_bind.cpp) and ddprun (launcher/net.cpp);
//   - a connection to it is refused until something listens there.
// Torch-free: only POSIX and the standard library.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <vector>

#include "unique_fd.h"  // beside it: tests include this header by its path

namespace ddp::detail {

// Throws std::system_error (the call that failed and errno) when no port can be had.
inline uint16_t reserve_port() {
  // The holders, never closed: the reservations last as long as the process.
  static std::mutex mutex;
  static std::vector<int> holders;
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const int one = 1;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    throw std::system_error(errno, std::generic_category(), "bind");
  std::lock_guard<std::mutex> lock(mutex);
  holders.push_back(fd.release());
  return ntohs(a.sin_port);
}

}  // namespace ddp::detail
