// A TCPStore client whose every call gives up after its timeout. LibTorch
// 1.13's client kept the receive timeout its wait() set on the socket; 2.x's
// sets none outside wait(), so a get/check/add on a link that went down (a
// cable, a namespace's veth) blocked for ever: ddprun's keep-alive and the
// stall report's store calls hung (NetnsFaults.LinkDown... showed it). And
// 2.x's constructor pings the server: one that accepts and never answers
// (hung, SIGSTOPped) held it for ever too, so the construction has a
// deadline of its own (store_deadline.h). Shared by the workers' store
// (process_group.cpp) and ddprun's rendezvous connections.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddp::store_client {

struct Connection {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::vector<int> sockets;  // the fds the construction opened (for store_deadline::Deadline)
};

// Connects as TCPStore(host, opts) does (opts.isServer false), giving up
// after `within`, then gives the connection's sockets receive and send
// timeouts of opts.timeout, and the store opts.timeout as its own. Once
// `stop` (asked every 50 ms) returns true, every answer the construction
// waits for fails; 1.13's constructor then throws at once, but 2.x's retries
// until `within` is up, so a caller that must stop quickly keeps `within`
// short and retries itself (ddprun: attempts of 2 s).
Connection connect(const std::string& host, const c10d::TCPStoreOptions& opts, std::chrono::milliseconds within,
                   const std::function<bool()>& stop = {});

// connect(host, opts, opts.timeout).store.
c10::intrusive_ptr<c10d::TCPStore> connect_bounded(const std::string& host, const c10d::TCPStoreOptions& opts);

}  // namespace ddp::store_client
