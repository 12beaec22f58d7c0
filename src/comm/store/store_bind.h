// Where a TCPStore server listens: on the address of the host it was given
// (MASTER_ADDR, --rdzv-endpoint), not on every interface. c10d's TCPStore
// server listens on the wildcard address; the store has no authentication, so
// anyone who reaches the port can read and write it. Private to libddp and
// ddprun, like c10d_compat.h, and the one place that knows how each LibTorch
// version can be told where to listen:
//   2.8 and later: TCPStoreOptions::masterListenFd takes a socket we bound.
//   1.13 to 2.7:   no such option; while this thread constructs the server,
//                  its bind() of the wildcard address is answered with our
//                  socket instead (store_bind.cpp, "the substitution";
//                  bind_substitution.h).
// Shared by the workers' store (process_group.cpp) and ddprun's rendezvous
// store (launcher/store_link.cpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddp::store_bind {

// Why the store could not be served here; callers word it for their users
// (which rank, which flag or variable to change).
class ListenError : public std::runtime_error {
 public:
  enum class Kind {
    Unresolved,  // the host name does not resolve
    NotLocal,    // not an address of this machine, and not reachable here either
    InUse,       // another socket holds the port on that address
    Other,
  };
  ListenError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct ServedStore {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string listening_on;  // "127.0.0.1:29500", or "*:29500" for every interface
  // Set when the store listens on every interface, and why (one line):
  // the host is not one of this machine's addresses (NAT, a container's port
  // mapping), or a name that resolves to loopback here only (/etc/hosts'
  // 127.0.1.1 for the machine's own name).
  std::string notice;
};

// Serves a TCPStore (opts.isServer must be true) on `host`'s address and
// connects this process's client to it. Throws ListenError when the host
// cannot be served here, and c10d's own errors for anything later.
ServedStore serve_tcp_store(const std::string& host, c10d::TCPStoreOptions opts);

}  // namespace ddp::store_bind
