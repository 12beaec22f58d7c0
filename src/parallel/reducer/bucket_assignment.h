// Which parameters share a bucket, PyTorch 1.13's policy, apart from the
// reducer that uses it so that tests can check it alone.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace ddp {

// Bucket assignment, PyTorch 1.13's rules. Parameters are
// taken in `order` and packed into buckets of one dtype and device each; per
// dtype and device, the first bucket closes once it holds at least first_cap
// bytes, the later ones at cap; a parameter is never split. Buckets come back
// in the order they become ready in `order` (by their last member), which is
// the order the reducer launches them in.
std::vector<std::vector<size_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<size_t>& order, int64_t first_cap,
                                                           int64_t cap);
// The same with one limit per bucket, the last repeating (PyTorch's
// bucket_size_limits; bucket_cap_mb_list).
std::vector<std::vector<size_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<size_t>& order,
                                                           const std::vector<int64_t>& limits);

// The buckets DistributedDataParallel starts with, before the real ready order
// is known, as PyTorch 1.13's constructor: packed in registration order (one
// bucket per dtype when find_unused_parameters is off, else first_cap then
// cap), then reversed, since gradients arrive roughly last layer first.
std::vector<std::vector<size_t>> initial_bucket_assignment(const std::vector<at::Tensor>& params, int64_t first_cap,
                                                           int64_t cap, bool find_unused_parameters);
// The same with one limit per bucket; by_limits false: one bucket per dtype.
std::vector<std::vector<size_t>> initial_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<int64_t>& limits, bool by_limits);

}  // namespace ddp
