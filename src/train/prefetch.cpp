#include "ddp/train/prefetch.h"

#ifdef DDP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp::detail {

DeviceCopy::DeviceCopy(torch::Device device) : device_(device) {
#ifdef DDP_WITH_CUDA
  if (device_.is_cuda())
    stream_ = std::make_shared<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device_.index()));
#endif
}

std::vector<at::Tensor> DeviceCopy::start(const std::vector<at::Tensor>& tensors, std::shared_ptr<void>& ready) {
  if (!device_.is_cuda()) return tensors;
#ifdef DDP_WITH_CUDA
  const auto& stream = *static_cast<c10::cuda::CUDAStream*>(stream_.get());
  c10::cuda::CUDAGuard device_guard(device_);
  c10::cuda::CUDAStreamGuard stream_guard(stream);
  std::vector<at::Tensor> copies;
  copies.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.is_cuda()) {
      copies.push_back(t.to(device_));
      continue;
    }
    // Pinned, the copy is asynchronous: it runs on the side stream while
    // the GPU computes the current step (LibTorch keeps the pinned buffer
    // until the copy is done).
    const at::Tensor pinned = t.is_pinned() ? t : t.pin_memory();
    copies.push_back(pinned.to(device_, /*non_blocking=*/true));
  }
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(stream);
  ready = event;
  return copies;
#else
  (void)ready;
  return tensors;
#endif
}

void DeviceCopy::use(const std::vector<at::Tensor>& copies, const std::shared_ptr<void>& ready) const {
#ifdef DDP_WITH_CUDA
  if (!ready) return;
  c10::cuda::CUDAGuard device_guard(device_);
  const auto current = c10::cuda::getCurrentCUDAStream(device_.index());
  static_cast<at::cuda::CUDAEvent*>(ready.get())->block(current);
  // Allocated on the side stream, used on this one: the caching allocator
  // must not hand the memory out again before this stream is done with it.
  for (const auto& t : copies)
    if (t.is_cuda()) t.record_stream(current);
#else
  (void)copies;
  (void)ready;
#endif
}

}  // namespace ddp::detail
