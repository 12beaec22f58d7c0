// Communication hooks: what DistributedDataParallel::register_comm_hook()
// takes. A hook receives each bucket of gradients (a GradBucket) the moment it
// is ready and returns a CommFuture of the reduced bucket, as PyTorch's
// CommHookInterface; the reducer copies the result back into the bucket and
// does not divide by the world size afterwards (the hook does, as PyTorch's
// allreduce_hook). The built-in hooks are in ddp/parallel/default_hooks.h.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

// One bucket as a hook sees it: its flat buffer (the gradients of its
// parameters, one dtype, not divided by the world size) and which parameters
// those are. As c10d::GradBucket.
class GradBucket {
 public:
  GradBucket(size_t index, size_t bucket_count, at::Tensor buffer, std::vector<at::Tensor> parameters);

  size_t index() const { return index_; }
  // The flat gradient tensor. Hooks may change it in place.
  const at::Tensor& buffer() const { return buffer_; }
  // Replaces what buffer() returns for the hooks this one calls (PyTorch's
  // set_buffer, for the compression wrappers); the bucket itself is unchanged.
  void set_buffer(at::Tensor buffer) { buffer_ = std::move(buffer); }
  // The last bucket to be reduced in this backward.
  bool is_last() const { return index_ + 1 == bucket_count_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  // Views of buffer() shaped as each parameter.
  std::vector<at::Tensor> gradients() const;

 private:
  size_t index_;
  size_t bucket_count_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
};

// The result of a hook: a tensor that is ready once a collective (a ddp::Work)
// has finished, and continuations that turn it into the reduced bucket. Where
// PyTorch's future runs its then() callbacks on the communication thread when
// the collective ends, these run in wait(), on the thread that waits: the
// reducer's end of backward. The arithmetic is the same; waiting honours the
// process group's timeout and fails with a CommError, as every ddp::Work.
class CommFuture {
 public:
  CommFuture() = default;
  // Ready once `work` has finished; its value is then `result`.
  CommFuture(Work work, at::Tensor result);
  // Already done.
  static CommFuture ready(at::Tensor result);

  // A future of fn(this future's value). Consumes this one.
  CommFuture then(std::function<at::Tensor(const at::Tensor&)> fn) &&;
  // Waits for the collective, runs the continuations once, and returns the
  // value (again, on later calls).
  at::Tensor wait();
  bool valid() const { return static_cast<bool>(state_); }
  // Runs `fn` the moment this future's collective ends, where that is its
  // end: a future made of a Work (no then()) whose backend can tell. It runs
  // on the backend's thread, or at once on this one if the collective has
  // ended: it must not take a lock its caller may hold. False otherwise (a
  // ready future, a continuation that may communicate again): then only
  // wait() knows when it is done. Not to be called beside wait() or then()
  // on a copy of the same future in another thread.
  bool on_complete(std::function<void()> fn);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// A registered hook with its state bound: the reducer's view of it.
using CommHook = std::function<CommFuture(GradBucket&)>;

}  // namespace ddp
