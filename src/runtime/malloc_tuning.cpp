#include "ddp/runtime/malloc_tuning.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

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

// Whether fix_malloc_thresholds() turned glibc's dynamic thresholds off (set
// once; read by whichever thread runs a first forward).
std::atomic<bool> thresholds_fixed{false};

// glibc's ceiling for the dynamic mmap threshold on 64-bit hosts
// (DEFAULT_MMAP_THRESHOLD_MAX).
constexpr std::size_t kDynamicMax = std::size_t{32} << 20;

// Why the library must not touch malloc here: the user chose its settings.
std::optional<std::string> left_to_user() {
  const std::string chosen = malloc_settings_chosen_by_user();
  if (chosen.empty()) return std::nullopt;
  return "left to the user's " + chosen;
}

MallocTuning apply(double mmap_threshold_mb) {
  MallocTuning t;
  if (auto why = left_to_user()) {
    t.reason = *why;
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
  thresholds_fixed = true;
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

std::size_t malloc_bytes_in_use() {
#if defined(__GLIBC__)
#if __GLIBC_PREREQ(2, 33)
  const auto m = mallinfo2();
#else
  const auto m = mallinfo();  // int fields: wrong past 2 GiB, which only skips the retention
#endif
  return static_cast<std::size_t>(m.uordblks) + static_cast<std::size_t>(m.hblkhd);
#else
  return 0;
#endif
}

HeapRetention retain_step_memory(std::size_t forward_bytes) {
  HeapRetention r;
  if (auto why = left_to_user()) {
    r.reason = *why;
    return r;
  }
#if defined(__GLIBC__)
  if (thresholds_fixed) {
    r.reason = "the malloc thresholds are fixed (fix_malloc_thresholds), so glibc's are not dynamic";
    return r;
  }
  if (forward_bytes > kDynamicMax) {
    r.reason = "the forward takes " + std::to_string(forward_bytes) +
               " bytes, more than glibc's dynamic threshold can reach (32 MiB): left as it is";
    return r;
  }
  // A block is mmap()ed only above the current threshold, and freeing it
  // raises the threshold only if its chunk (request + header, rounded up to
  // a page) stays within the ceiling: keep two pages of room.
  const std::size_t block = kDynamicMax - 2 * 4096;
  // Through a volatile pointer, so that the pair is not optimised away.
  void* volatile p = std::malloc(block);
  if (p == nullptr) {
    r.reason = "malloc of " + std::to_string(block) + " bytes failed";
    return r;
  }
  std::free(p);
  r.applied = true;
  r.threshold = block;
  r.reason = "glibc's dynamic mmap threshold raised to " + std::to_string(block) +
             " bytes (trim threshold twice that), by freeing one block of that size";
#else
  (void)forward_bytes;
  (void)kDynamicMax;
  r.reason = "not glibc";
#endif
  return r;
}

}  // namespace ddp
