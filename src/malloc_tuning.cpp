#include "ddp/malloc_tuning.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ddp {

std::string malloc_settings_chosen_by_user() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"})
    if (std::getenv(name)) return name;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return "GLIBC_TUNABLES";
  return "";
}

namespace {

MallocTuning apply(double mmap_threshold_mb) {
  MallocTuning t;
  const std::string chosen = malloc_settings_chosen_by_user();
  if (!chosen.empty()) {
    t.reason = "left to the user's " + chosen;
    return t;
  }
#if defined(__GLIBC__)
  // glibc caps the mmap threshold at 32 MiB on 64-bit hosts (HEAP_MAX_SIZE / 2);
  // below its own 128 KiB default every small tensor would be an mmap().
  const double mb = std::clamp(mmap_threshold_mb, 0.125, 32.0);
  t.mmap_threshold = static_cast<std::size_t>(mb * 1024 * 1024);
  t.trim_threshold = 2 * t.mmap_threshold;
  // Either call also turns the dynamic adjustment off for good.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(t.mmap_threshold)) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(t.trim_threshold)) != 1) {
    t.reason = "mallopt refused a threshold of " + std::to_string(t.mmap_threshold) + " bytes";
    return t;
  }
  t.applied = true;
  t.reason = "M_MMAP_THRESHOLD " + std::to_string(t.mmap_threshold) + ", M_TRIM_THRESHOLD " +
             std::to_string(t.trim_threshold);
#else
  t.reason = "not glibc";
#endif
  return t;
}

}  // namespace

MallocTuning fix_malloc_thresholds(double mmap_threshold_mb) {
  if (!(mmap_threshold_mb > 0)) {
    MallocTuning t;
    t.reason = "not requested (threshold " + std::to_string(mmap_threshold_mb) + " MiB)";
    return t;
  }
  static std::once_flag once;
  static MallocTuning result;
  std::call_once(once, [&] { result = apply(mmap_threshold_mb); });
  return result;
}

}  // namespace ddp
