// The communication hooks PyTorch ships in
// torch.distributed.algorithms.ddp_comm_hooks.default_hooks, with the same
// names and arithmetic. Their state is the process group to reduce over (null:
// the default group).
//
//   model.register_comm_hook(pg, ddp::hooks::allreduce_hook);
//   model.register_comm_hook(pg, ddp::hooks::fp16_compress_hook);
//   model.register_comm_hook(pg, ddp::hooks::fp16_compress_wrapper(my_hook));
#pragma once

#include <memory>

#include "ddp/parallel/comm_hook.h"
#include "ddp/comm/process_group.h"

namespace ddp::hooks {

// Divides the bucket by the world size, then all-reduces it in place: the
// same result as no hook at all.
CommFuture allreduce_hook(const std::shared_ptr<ProcessGroup>& pg, GradBucket& bucket);

// Casts the bucket to float16, divides by the world size, all-reduces the
// half-size copy and copies the sum back into the bucket.
CommFuture fp16_compress_hook(const std::shared_ptr<ProcessGroup>& pg, GradBucket& bucket);

// The same in bfloat16. Gloo in LibTorch 1.13 cannot all-reduce bfloat16:
// there it fails with a CommError that says so.
CommFuture bf16_compress_hook(const std::shared_ptr<ProcessGroup>& pg, GradBucket& bucket);

namespace detail {
CommFuture compress_around(GradBucket& bucket, at::ScalarType dtype,
                           const std::function<CommFuture(GradBucket&)>& inner);
}

// Runs `hook` on a float16 copy of the bucket and copies its result back:
// fp16_compress_wrapper(allreduce_hook) is fp16_compress_hook.
template <typename Hook>
auto fp16_compress_wrapper(Hook hook) {
  return [hook](auto& state, GradBucket& bucket) {
    return detail::compress_around(bucket, at::kHalf, [&](GradBucket& b) { return hook(state, b); });
  };
}

// The same in bfloat16 (see bf16_compress_hook about Gloo).
template <typename Hook>
auto bf16_compress_wrapper(Hook hook) {
  return [hook](auto& state, GradBucket& bucket) {
    return detail::compress_around(bucket, at::kBFloat16, [&](GradBucket& b) { return hook(state, b); });
  };
}

}  // namespace ddp::hooks
