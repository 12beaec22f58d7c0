// ddp::Work (ddp/comm/process_group.h): waiting for a backend's handle, and
// the errors that name the rank, the operation and, for a send or receive,
// its peer and tag.
#include <string>

#include "comm/work_handle.h"
#include "ddp/comm/process_group.h"
#include "ddp/errors.h"

namespace ddp {

const std::string& Work::op() const {
  static const std::string none;
  return handle_ ? handle_->op : none;
}

namespace {

// A failed wait as a CommError naming the rank and the operation (a send's
// or receive's peer and tag); a collective's adds what uneven inputs do.
[[noreturn]] void throw_wait_failed(const detail::WorkHandle& h, const std::string& what) {
  std::string message = "rank " + std::to_string(h.rank) + ": " + h.op + " failed: " + what;
  if (h.p2p != detail::PointToPoint::none) {
    message += "\n  (the peer may have died, be stuck or never post the matching " +
               std::string(h.p2p == detail::PointToPoint::send ? "receive" : "send") +
               " with this tag; its own log says why. The process group's timeout bounds this wait: "
               "ddp::ProcessGroupOptions().timeout(...))";
    throw CommError(message);
  }
  throw CommError(message +
                  "\n  (a peer may have died or be stuck; its own log says why. The process group's "
                  "timeout bounds this wait: ddp::ProcessGroupOptions().timeout(...))"
                  "\n  If ranks may have different numbers of batches (uneven inputs), a rank that finished "
                  "early has left, or gone on to another collective, while this one still trains: wrap the "
                  "training loop in ddp::Join (ddp/parallel/join.h), or give every rank the same number of batches "
                  "(DistributedSampler's padding, the default, or drop_last).");
}

}  // namespace

void Work::wait() {
  if (!handle_) return;
  try {
    handle_->work->wait();
  } catch (const std::exception& e) {
    throw_wait_failed(*handle_, e.what());
  }
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!handle_) return;
  bool done = false;
  std::string failure;
  try {
    done = handle_->work->wait(timeout);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Still running: the wait gave up (Gloo finishes a timed-out receive with its error instead).
  if (!done && !handle_->work->isCompleted())
    throw_wait_failed(*handle_, "not finished within the wait's timeout of " + std::to_string(timeout.count()) + " ms");
  if (!failure.empty()) throw_wait_failed(*handle_, failure);
}

bool Work::is_completed() const { return !handle_ || handle_->work->isCompleted(); }

int Work::source_rank() const {
  using detail::PointToPoint;
  const PointToPoint kind = handle_ ? handle_->p2p : PointToPoint::none;
  if (kind == PointToPoint::recv) return handle_->peer;
  if (kind == PointToPoint::recv_any) return handle_->work->sourceRank();
  throw UsageError("Work::source_rank() is a receive's (dist::recv, dist::irecv), as c10d's sourceRank(); this Work "
                   "is " + (handle_ ? handle_->op : std::string("empty")));
}

namespace {

// The backend's future of `handle`'s work, or null where it has none.
c10::intrusive_ptr<c10::ivalue::Future> future_of(const detail::WorkHandle* handle) {
  if (!handle) return {};
  try {
    return handle->work->getFuture();
  } catch (const std::exception&) {
    return {};  // c10d::Work's default: this backend has no future
  }
}

}  // namespace

bool Work::on_complete(std::function<void()> fn) {
  auto future = future_of(handle_.get());
  if (!future) return false;
  future->addCallback([fn = std::move(fn)](c10::ivalue::Future&) { fn(); });
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::get_future() const {
  auto future = future_of(handle_.get());
  if (!future)
    throw UsageError("rank " + std::to_string(handle_ ? handle_->rank : 0) + ": Work::get_future(): " +
                     (handle_ ? handle_->op + " has no future on this backend" : std::string("an empty Work")) +
                     "; wait() on the Work instead");
  return future;
}

}  // namespace ddp
