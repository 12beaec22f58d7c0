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

struct WorkHandle {
  c10::intrusive_ptr<c10d::Work> work;
  std::string op;  // "gloo allreduce", for errors
  int rank = 0;
  bool any_source = false;  // a receive from any rank: work->sourceRank() names the sender
};

// A Work for the backend's `work`, named `op` in its errors.
inline Work make_work(c10::intrusive_ptr<c10d::Work> work, std::string op, int rank, bool any_source = false) {
  if (!work) return Work();
  return Work(std::make_shared<WorkHandle>(WorkHandle{std::move(work), std::move(op), rank, any_source}));
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
