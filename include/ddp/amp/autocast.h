// ddp::Autocast: mixed precision for a region of code, as PyTorch's
// torch.autocast(device_type, dtype). Inside the region the operations that
// autocast lists (matrix products, convolutions) run in the lower precision
// and the precision-sensitive ones (losses, norms, softmax) in float32, while
// parameters, and so their gradients and DDP's buckets, stay float32.
//
//   torch::Tensor loss;
//   {
//     ddp::Autocast autocast(torch::kCPU);  // bfloat16 on CPU; float16 by default on CUDA
//     loss = torch::nll_loss(model(x), y);
//   }
//   loss.backward();                        // outside the region, as PyTorch advises
//
// The state is per thread, restored when the guard ends; guards nest. A
// DataLoader's worker threads and DDP's communication threads are not
// affected.
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace ddp {

class Autocast {
 public:
  // `dtype`: the lower precision; none means the thread's current one for
  // the device, as PyTorch (bfloat16 on CPU, float16 on CUDA unless an outer
  // region set another). `enabled` false turns autocast
  // off inside the region (also when an outer region turned it on).
  // `cache_enabled`: keep the lower-precision copies of parameters for the
  // region (none: leave the thread's setting, on by default).
  // Throws ddp::UsageError for a device type autocast does not support, or
  // (when enabled) a dtype it does not support there (LibTorch 1.13's CPU autocast supports
  // bfloat16 only; PyTorch warns and disables, we refuse).
  explicit Autocast(c10::DeviceType device_type, std::optional<c10::ScalarType> dtype = std::nullopt,
                    bool enabled = true, std::optional<bool> cache_enabled = std::nullopt);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

// The lower precision mixed precision uses on `device` (--amp): bfloat16 on
// CPU, float16 on CUDA (with a ddp::GradScaler, ddp/amp/grad_scaler.h).
c10::ScalarType amp_dtype(const c10::Device& device);

// Whether autocast is on for `device_type` in this thread, and the lower
// precision it casts to there.
bool autocast_enabled(c10::DeviceType device_type);
c10::ScalarType autocast_dtype(c10::DeviceType device_type);

}  // namespace ddp
