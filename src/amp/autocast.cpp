// ddp::Autocast: the thread's autocast switches set and restored as
// torch.autocast's __enter__ and __exit__ do (c10d_compat.h names them for
// each LibTorch version).
#include "ddp/amp/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <string>

#include "comm/c10d_compat.h"
#include "ddp/errors.h"

namespace ddp {

namespace {

void check_supported(c10::DeviceType type, c10::ScalarType dtype, bool enabled) {
  if (type != c10::DeviceType::CPU && type != c10::DeviceType::CUDA)
    throw UsageError("ddp::Autocast: device type " + c10::DeviceTypeName(type) +
                     " is not supported; use torch::kCPU or torch::kCUDA");
  if (!enabled) return;  // a region with autocast off casts nothing: any dtype will do, as in PyTorch
  if (dtype != c10::ScalarType::BFloat16 && dtype != c10::ScalarType::Half)
    throw UsageError(std::string("ddp::Autocast: dtype ") + c10::toString(dtype) +
                     " is not a lower precision autocast can use; use torch::kBFloat16 or torch::kHalf");
#if TORCH_VERSION_MAJOR < 2
  if (type == c10::DeviceType::CPU && dtype != c10::ScalarType::BFloat16)
    throw UsageError("ddp::Autocast: LibTorch " TORCH_VERSION
                     " autocasts to bfloat16 only on CPU; use torch::kBFloat16 (or no dtype) there");
#endif
}

}  // namespace

Autocast::Autocast(c10::DeviceType device_type, std::optional<c10::ScalarType> dtype, bool enabled,
                   std::optional<bool> cache_enabled)
    : device_type_(device_type) {
  // No dtype: the thread's current one, as torch.autocast (float16 on CUDA
  // and bfloat16 on CPU unless an outer region or the program changed it).
  const auto fast = dtype.value_or(compat::autocast_dtype(device_type));
  check_supported(device_type, fast, enabled);
  prev_enabled_ = compat::autocast_enabled(device_type);
  prev_dtype_ = compat::autocast_dtype(device_type);
  prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  compat::set_autocast_enabled(device_type, enabled);
  // A region with autocast off keeps the thread's dtype: LibTorch refuses to
  // set one it cannot use, and nothing is cast there.
  if (enabled) compat::set_autocast_dtype(device_type, fast);
  at::autocast::increment_nesting();
  if (cache_enabled) at::autocast::set_autocast_cache_enabled(*cache_enabled);
}

Autocast::~Autocast() {
  // The lower-precision copies of parameters live until the outermost region ends.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_type_, prev_enabled_);
  compat::set_autocast_dtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

c10::ScalarType amp_dtype(const c10::Device& device) {
  return device.is_cuda() ? c10::ScalarType::Half : c10::ScalarType::BFloat16;
}

bool autocast_enabled(c10::DeviceType device_type) { return compat::autocast_enabled(device_type); }
c10::ScalarType autocast_dtype(c10::DeviceType device_type) { return compat::autocast_dtype(device_type); }

}  // namespace ddp
