#include "ddp/parallel/default_hooks.h"

#include <c10/util/StringUtil.h>

namespace ddp::hooks {
namespace {

std::shared_ptr<ProcessGroup> group_or_default(const std::shared_ptr<ProcessGroup>& pg) {
  return pg ? pg : default_process_group();
}

// The all-reduce of `tensor`, as a future of `tensor`. A backend that cannot
// sum its dtype (Gloo in LibTorch 1.13 and bfloat16) fails on every rank
// alike, before sending anything; its words ("Invalid scalar type") name
// neither the dtype nor a way out, so the wait adds both.
CommFuture allreduce_future(ProcessGroup& pg, at::Tensor tensor, const char* hook) {
  Work work = pg.allreduce(tensor);
  const std::string context = c10::str("rank ", pg.rank(), ": ", hook, ": the ", pg.backend_name(),
                                       " backend cannot all-reduce a ", tensor.scalar_type(), " tensor on ",
                                       tensor.device().str(), " in this LibTorch.");
  const at::ScalarType dtype = tensor.scalar_type();
  return CommFuture::ready(tensor).then([work, context, dtype](const at::Tensor& t) mutable {
    try {
      work.wait();
    } catch (const CommError& e) {
      const std::string what = e.what();
      if (what.find("scalar type") == std::string::npos && what.find("dtype") == std::string::npos) throw;
      std::string advice;
      if (dtype == at::kBFloat16)
        advice = " Use fp16_compress_hook (float16) instead, or the nccl backend on GPUs, which sums bfloat16.";
      else if (dtype == at::kHalf)
        advice = " Use allreduce_hook (no compression), or the nccl backend on GPUs.";
      // Its first line; the rest is a C++ backtrace and advice about dead peers.
      throw CommError(context + advice + "\n  The backend said: " + what.substr(0, what.find('\n')));
    }
    return t;
  });
}

}  // namespace

CommFuture allreduce_hook(const std::shared_ptr<ProcessGroup>& state, GradBucket& bucket) {
  auto pg = group_or_default(state);
  at::Tensor tensor = bucket.buffer();
  tensor.div_(pg->size());
  return allreduce_future(*pg, tensor, "allreduce_hook");
}

namespace {

CommFuture compress_hook(const std::shared_ptr<ProcessGroup>& state, GradBucket& bucket, at::ScalarType dtype,
                         const char* name) {
  auto pg = group_or_default(state);
  at::Tensor compressed = bucket.buffer().to(dtype).div_(pg->size());
  at::Tensor buffer = bucket.buffer();
  return allreduce_future(*pg, compressed, name).then([buffer](const at::Tensor& reduced) {
    at::Tensor out = buffer;
    out.copy_(reduced);
    return out;
  });
}

}  // namespace

CommFuture fp16_compress_hook(const std::shared_ptr<ProcessGroup>& pg, GradBucket& bucket) {
  return compress_hook(pg, bucket, at::kHalf, "fp16_compress_hook");
}

CommFuture bf16_compress_hook(const std::shared_ptr<ProcessGroup>& pg, GradBucket& bucket) {
  return compress_hook(pg, bucket, at::kBFloat16, "bf16_compress_hook");
}

namespace detail {

CommFuture compress_around(GradBucket& bucket, at::ScalarType dtype,
                           const std::function<CommFuture(GradBucket&)>& inner) {
  // As PyTorch's wrappers: the wrapped hook sees the compressed buffer, and
  // its result is copied into that buffer, which the reducer then copies
  // (casting back) into the bucket.
  at::Tensor compressed = bucket.buffer().to(dtype);
  bucket.set_buffer(compressed);
  return inner(bucket).then([compressed](const at::Tensor& result) {
    at::Tensor out = compressed;
    out.copy_(result);
    return out;
  });
}

}  // namespace detail
}  // namespace ddp::hooks
