// The bucket assignment policy, as PyTorch 1.13's reducer: which gradients
// share a bucket in the first iteration and after the rebuild, and the order
// the buckets launch in. Pure functions, tested alone.
#include "parallel/reducer/bucket_assignment.h"

#include "ddp/parallel/ddp_options.h"

#include <algorithm>
#include <limits>
#include <map>

#include "comm/c10d_compat.h"

namespace ddp {

double first_bucket_mb_in_effect(const DistributedDataParallelOptions& options) {
  if (compat::kFirstBucketFollowsGivenCap && !options.first_bucket_mb_given() && options.bucket_cap_mb_given() &&
      !options.bucket_cap_auto())
    return options.bucket_cap_mb();
  return options.first_bucket_mb();
}

std::vector<int64_t> bucket_limits_in_effect(const DistributedDataParallelOptions& options, double cap_mb) {
  auto bytes = [](double mb) { return static_cast<int64_t>(mb * 1024 * 1024); };  // PyTorch's int(mb * 1024 * 1024)
  const auto& list = options.bucket_cap_mb_list();
  if (list.empty()) return {bytes(first_bucket_mb_in_effect(options)), bytes(cap_mb)};
  if (options.first_bucket_mb_given())
    throw UsageError(
        "DistributedDataParallelOptions: first_bucket_mb and bucket_cap_mb_list both give the first bucket's cap; give "
        "one (the list's first entry is the first bucket's)");
  std::vector<int64_t> limits;
  for (double mb : list) limits.push_back(bytes(mb));
  return limits;
}

namespace {

// Packs `order` into buckets as PyTorch's compute_bucket_assignment_by_size:
// one open bucket per dtype and device, closed once it reaches its limit;
// each dtype and device walks `limits` (the last one repeats).
std::vector<std::vector<size_t>> pack(const std::vector<at::Tensor>& params, const std::vector<size_t>& order,
                                      const std::vector<int64_t>& limits) {
  struct Open {
    std::vector<size_t> vars;
    int64_t bytes = 0;
    size_t limit = 0;  // index into limits
  };
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::vector<size_t>> result;
  for (size_t i : order) {
    const auto& p = params.at(i);
    auto& bucket = open[{static_cast<int>(p.scalar_type()), p.device().str()}];
    bucket.vars.push_back(i);
    bucket.bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (bucket.bytes >= limits[bucket.limit]) {
      result.push_back(std::move(bucket.vars));
      bucket.vars.clear();
      bucket.bytes = 0;
      bucket.limit = std::min(bucket.limit + 1, limits.size() - 1);
    }
  }
  for (auto& [key, bucket] : open)
    if (!bucket.vars.empty()) result.push_back(std::move(bucket.vars));
  return result;
}

}  // namespace

std::vector<std::vector<size_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<size_t>& order, int64_t first_cap,
                                                           int64_t cap) {
  return compute_bucket_assignment(params, order, std::vector<int64_t>{first_cap, cap});
}

std::vector<std::vector<size_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<size_t>& order,
                                                           const std::vector<int64_t>& limits) {
  auto result = pack(params, order, limits);
  // A bucket is ready when its last member is: launch in that order, so that
  // a bucket of another dtype whose first member came early does not hold
  // back the ones behind it.
  std::vector<size_t> position(params.size());
  for (size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  std::stable_sort(result.begin(), result.end(),
                   [&](const auto& a, const auto& b) { return position[a.back()] < position[b.back()]; });
  return result;
}

std::vector<std::vector<size_t>> initial_bucket_assignment(const std::vector<at::Tensor>& params, int64_t first_cap,
                                                           int64_t cap, bool find_unused_parameters) {
  return initial_bucket_assignment(params, std::vector<int64_t>{first_cap, cap}, find_unused_parameters);
}

std::vector<std::vector<size_t>> initial_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<int64_t>& limits, bool by_limits) {
  std::vector<size_t> order(params.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  // PyTorch 1.13 packs the first iteration into one bucket per dtype unless
  // find_unused_parameters is on; the rebuild after it uses the caps.
  auto result = pack(params, order, by_limits ? limits : std::vector<int64_t>{std::numeric_limits<int64_t>::max()});
  std::sort(result.begin(), result.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::reverse(result.begin(), result.end());
  return result;
}

}  // namespace ddp
