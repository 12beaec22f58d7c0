#include "staging_buffers.h"

#ifdef DDP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <optional>

namespace ddp::detail {

#ifdef DDP_WITH_CUDA
struct StagingBuffers::Side {
  explicit Side(c10::DeviceIndex device) : device(device), stream(c10::cuda::getStreamFromPool(false, device)) {}
  c10::DeviceIndex device;
  c10::cuda::CUDAStream stream;
  bool used = false;  // copies queued in this save
};
#else
struct StagingBuffers::Side {};
#endif

StagingBuffers::StagingBuffers() = default;
StagingBuffers::~StagingBuffers() = default;

void StagingBuffers::restart() {
  next_ = 0;
#ifdef DDP_WITH_CUDA
  for (auto& side : sides_) side->used = false;  // a save whose staging failed is not waited for
#endif
}

at::Tensor StagingBuffers::copy(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (next_ == buffers_.size()) buffers_.emplace_back();
  at::Tensor& buffer = buffers_[next_++];
  if (!buffer.defined() || buffer.sizes() != t.sizes() || buffer.scalar_type() != t.scalar_type()) {
    auto options = t.options().device(torch::kCPU).requires_grad(false);
    buffer = torch::empty(t.sizes(), t.is_cuda() ? options.pinned_memory(true) : options);
  }
#ifdef DDP_WITH_CUDA
  if (t.is_cuda()) {
    const auto device = t.device().index();
    Side* side = nullptr;
    for (auto& s : sides_)
      if (s->device == device) side = s.get();
    if (!side) side = sides_.emplace_back(std::make_unique<Side>(device)).get();
    if (!side->used) {  // after what the training stream queued so far
      at::cuda::CUDAEvent queued;
      queued.record(c10::cuda::getCurrentCUDAStream(device));
      queued.block(side->stream);
      side->used = true;
    }
    c10::cuda::CUDAStreamGuard on_side(side->stream);
    buffer.copy_(t.detach(), /*non_blocking=*/true);
    // The caching allocator must not hand t's memory to another stream
    // before the copy has read it.
    t.record_stream(side->stream);
    return buffer;
  }
#endif
  buffer.copy_(t.detach());
  return buffer;
}

std::function<void()> StagingBuffers::seal() {
#ifdef DDP_WITH_CUDA
  std::vector<std::shared_ptr<at::cuda::CUDAEvent>> copied;
  for (auto& side : sides_) {
    if (!side->used) continue;
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(side->stream);
    done->block(c10::cuda::getCurrentCUDAStream(side->device));
    copied.push_back(std::move(done));
    side->used = false;
  }
  if (!copied.empty())
    return [copied] {
      for (const auto& done : copied) done->synchronize();
    };
#endif
  return [] {};
}

}  // namespace ddp::detail
