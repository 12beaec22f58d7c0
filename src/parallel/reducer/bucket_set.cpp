// The reducer's buckets and their views (bucket_set.h).
#include "parallel/reducer/bucket_set.h"

#include <torch/torch.h>

#include <algorithm>

namespace ddp::detail {

at::Tensor BucketSet::alias(const at::Tensor& contents, int64_t offset, const at::Tensor& like) {
  std::vector<int64_t> strides;
  if (like.is_non_overlapping_and_dense()) {
    strides.assign(like.strides().begin(), like.strides().end());
  } else {
    strides.assign(like.dim(), 1);
    for (int64_t d = like.dim() - 2; d >= 0; --d) strides[d] = strides[d + 1] * std::max<int64_t>(like.size(d + 1), 1);
  }
  return at::empty({0}, contents.options()).set_(contents.storage(), contents.storage_offset() + offset, like.sizes(), strides);
}

void BucketSet::lay_out(const std::vector<at::Tensor>& params, const Assignment& assignment,
                        bool gradient_as_bucket_view) {
  torch::NoGradGuard no_grad;
  buckets_.clear();
  slots_.assign(params.size(), {});
  for (const auto& vars : assignment) {
    Bucket b;
    b.vars = vars;
    int64_t total = 0;
    for (size_t i : vars) total += params[i].numel();
    b.contents = at::zeros({total}, params[vars.front()].options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k = 0; k < vars.size(); ++k) {
      const auto& p = params[vars[k]];
      b.views.push_back(alias(b.contents, offset, p));
      slots_[vars[k]] = {buckets_.size(), k};
      offset += p.numel();
      auto& grad = p.mutable_grad();
      if (gradient_as_bucket_view && grad.defined()) {
        b.views.back().copy_(grad);
        grad = b.views.back();
      }
    }
    b.pending = vars.size();
    buckets_.push_back(std::move(b));
  }
}

bool BucketSet::adopt(const std::vector<at::Tensor>& params, const Assignment& assignment,
                      bool gradient_as_bucket_view) {
  bool same = assignment.size() == buckets_.size();
  for (size_t b = 0; same && b < buckets_.size(); ++b) same = assignment[b] == buckets_[b].vars;
  if (!same) lay_out(params, assignment, gradient_as_bucket_view);
  return !same;
}

Assignment BucketSet::assignment() const {
  Assignment out;
  for (const auto& b : buckets_) out.push_back(b.vars);
  return out;
}

int64_t BucketSet::total_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += b.bytes();
  return total;
}

void BucketSet::reset() {
  for (auto& b : buckets_) {
    b.pending = b.vars.size();
    b.reduced = CommFuture();
  }
}

std::optional<std::vector<size_t>> agree_on_ready_order(ProcessGroup& pg, const std::vector<size_t>& order,
                                                        size_t num_params) {
  // The first element says whether rank 0's order is complete.
  std::vector<int64_t> message(num_params + 1, -1);
  message[0] = order.size() == num_params ? 1 : 0;
  for (size_t k = 0; k < order.size() && k < num_params; ++k) message[k + 1] = static_cast<int64_t>(order[k]);
  auto tensor = torch::tensor(message, torch::kInt64).to(pg.device());
  if (pg.size() > 1) pg.broadcast(tensor, 0).wait();
  auto cpu = tensor.cpu();
  const int64_t* data = cpu.data_ptr<int64_t>();
  if (data[0] != 1) return std::nullopt;
  return std::vector<size_t>(data + 1, data + 1 + num_params);
}

}  // namespace ddp::detail
