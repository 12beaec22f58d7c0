// What stands behind ddp::Work and ddp::StoreHandle: c10d's own handles,
// which the public headers keep out of sight. For the backends (c10d's and
// our MPI group) and what uses the store (the stall inspector).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <string>
#include <utility>

#include "ddp/comm/process_group.h"

namespace ddp {

namespace detail {

// What a Work's point-to-point operation is, for source_rank() and errors.
enum class PointToPoint { none, send, recv, recv_any };

struct WorkHandle {
  c10::intrusive_ptr<c10d::Work> work;
  std::string op;  // "gloo allreduce", "gloo recv from rank 1 (tag 0)": for errors
  int rank = 0;
  PointToPoint p2p = PointToPoint::none;
  int peer = -1;  // a send's or receive's group rank (-1: any)
};

// A Work for the backend's `work`, named `op` in its errors.
inline Work make_work(c10::intrusive_ptr<c10d::Work> work, std::string op, int rank) {
  if (!work) return Work();
  return Work(std::make_shared<WorkHandle>(WorkHandle{std::move(work), std::move(op), rank}));
}

// The Work of a send or receive of `call` (Kind::Send, Kind::Recv), named
// with its peer and tag: "gloo recv from rank 1 (tag 0)".
inline Work make_p2p_work(c10::intrusive_ptr<c10d::Work> work, const std::string& backend, const CollectiveCall& call,
                          int rank) {
  if (!work) return Work();
  const bool send = call.kind == CollectiveCall::Kind::Send;
  const std::string peer = call.root < 0 ? "any rank" : "rank " + std::to_string(call.root);
  auto handle = std::make_shared<WorkHandle>(WorkHandle{
      std::move(work), backend + (send ? " send to " : " recv from ") + peer + " (tag " + std::to_string(call.tag) + ")",
      rank});
  handle->p2p = send ? PointToPoint::send : call.root < 0 ? PointToPoint::recv_any : PointToPoint::recv;
  handle->peer = call.root;
  return Work(std::move(handle));
}

}  // namespace detail

class StoreHandle {
 public:
  explicit StoreHandle(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  c10d::Store& operator*() const { return *store_; }
  c10d::Store* operator->() const { return store_.get(); }
  const c10::intrusive_ptr<c10d::Store>& get() const { return store_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace ddp
