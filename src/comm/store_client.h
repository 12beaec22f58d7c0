// A TCPStore client whose every call gives up after its timeout. LibTorch
// 1.13's client kept the receive timeout its wait() set on the socket; 2.x's
// sets none outside wait(), so a get/check/add on a link that went down (a
// cable, a namespace's veth) blocked for ever: ddprun's keep-alive and the
// stall report's store calls hung (NetnsFaults.LinkDown... showed it). Shared
// by the workers' store (process_group.cpp) and ddprun's watch connection.
#pragma once

#include <string>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddp::store_client {

// Connects as TCPStore(host, opts) does (opts.isServer false), then gives
// the sockets the construction opened receive and send timeouts of
// opts.timeout.
c10::intrusive_ptr<c10d::TCPStore> connect_bounded(const std::string& host, const c10d::TCPStoreOptions& opts);

}  // namespace ddp::store_client
