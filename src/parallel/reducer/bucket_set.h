// The reducer's buckets: each one flat tensor of one dtype, with views that
// alias it laid out like the parameters it holds (the gradients live in them
// with gradient_as_bucket_view), which bucket and place each parameter's
// gradient goes to, and each bucket's reduction of this iteration (the comm
// hook's future; the built-in hook is an all-reduce). Which
// parameters share a bucket is bucket_assignment.cpp's policy; when a bucket
// launches is reducer.cpp's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/parallel/comm_hook.h"

namespace ddp::detail {

using Assignment = std::vector<std::vector<size_t>>;  // parameter indices, per bucket

struct Bucket {
  at::Tensor contents;            // flat, one dtype
  std::vector<size_t> vars;       // parameter indices
  std::vector<at::Tensor> views;  // aliases of contents laid out like each parameter
  size_t pending = 0;             // gradients not yet ready this iteration
  CommFuture reduced;             // launched this iteration: the comm hook's future of the reduced bucket

  int64_t bytes() const { return contents.numel() * contents.element_size(); }
};

class BucketSet {
 public:
  // Lays the buckets out as `assignment`, every bucket pending in full. With
  // `gradient_as_bucket_view`, gradients that live in the old buckets (a
  // rebuild during gradient accumulation) move into the new ones.
  void lay_out(const std::vector<at::Tensor>& params, const Assignment& assignment, bool gradient_as_bucket_view);
  // The same, unless `assignment` packs the buckets there already are: then
  // reallocating would only cost a bucket's worth of peak memory and a copy
  // of every gradient. Every rank sees the same assignment, so all decide
  // alike. Whether it laid them out.
  bool adopt(const std::vector<at::Tensor>& params, const Assignment& assignment, bool gradient_as_bucket_view);

  size_t size() const { return buckets_.size(); }
  bool empty() const { return buckets_.empty(); }
  Bucket& operator[](size_t k) { return buckets_[k]; }
  const Bucket& operator[](size_t k) const { return buckets_[k]; }
  auto begin() { return buckets_.begin(); }
  auto end() { return buckets_.end(); }
  auto begin() const { return buckets_.begin(); }
  auto end() const { return buckets_.end(); }

  size_t bucket_of(size_t param) const { return slots_[param].bucket; }
  const at::Tensor& view_of(size_t param) const { return buckets_[slots_[param].bucket].views[slots_[param].index]; }
  Assignment assignment() const;
  int64_t total_bytes() const;

  // Every bucket pending in full again, no reduction held.
  void reset();

  // A tensor that aliases `contents` without being an autograd view:
  // LibTorch's Optimizer::zero_grad() calls detach_() on every grad, which
  // views reject. Laid out as `like` when that is dense (channels_last stays
  // channels_last, so AccumulateGrad's gradient copies in without a
  // transpose), else row-major, as PyTorch's bucket views.
  static at::Tensor alias(const at::Tensor& contents, int64_t offset, const at::Tensor& like);
  // Whether `grad` is `view` itself (same memory, shape and strides).
  static bool is_alias(const at::Tensor& grad, const at::Tensor& view) {
    return grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes() &&
           grad.strides() == view.strides();
  }

 private:
  struct Slot {
    size_t bucket = 0;
    size_t index = 0;  // within the bucket
  };
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;  // per parameter
};

// The rebuild's agreement (collective: a broadcast from rank 0): every rank
// adopts rank 0's ready order, so buckets and collectives match. Empty when
// rank 0's order is not complete (it did not see every parameter's hook):
// then every rank keeps its buckets.
std::optional<std::vector<size_t>> agree_on_ready_order(ProcessGroup& pg, const std::vector<size_t>& order,
                                                        size_t num_params);

}  // namespace ddp::detail
