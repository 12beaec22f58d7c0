// Fixed malloc thresholds for CPU training with persistent gradients.
//
// glibc's malloc starts with a 128 KiB mmap threshold and raises it to the
// size of every mmap()ed block that is freed ("dynamic threshold", up to
// 32 MiB), and its trim threshold to twice that. Training that accumulates
// into gradients that already exist (gradient_as_bucket_view, or any step
// after the first) frees a gradient-sized temporary per layer per step; after
// the first such free those temporaries come from the heap, and the holes
// they leave stay resident. With about 100 MB of parameters that is 19-55 MB
// of freed memory that RSS keeps (docs/performance.md, "Where the memory
// goes"). Fixing both thresholds at a gradient's size returns every
// gradient-sized temporary to the system when it is freed, and keeps smaller
// blocks (activations of small models) in the heap for reuse: a fixed 1 MiB
// threshold would make every larger activation a fresh mmap() and cost page
// faults on every step.
#pragma once

#include <cstddef>
#include <string>

namespace ddp {

struct MallocTuning {
  bool applied = false;
  std::string reason;  // why not, when not applied; what was set when applied
  std::size_t mmap_threshold = 0;
  std::size_t trim_threshold = 0;
};

// The environment variable through which the user already chose glibc's
// malloc settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_, or glibc.malloc.* in GLIBC_TUNABLES),
// or "" if none: a choice the library never overrides.
std::string malloc_settings_chosen_by_user();

// Sets M_MMAP_THRESHOLD to mmap_threshold_mb MiB (clamped to glibc's
// 128 KiB .. 32 MiB) and M_TRIM_THRESHOLD to twice that, once per process
// (later calls return the first applied call's result), unless the user chose
// malloc settings in the environment, the threshold is not positive, or the C
// library is not glibc. DistributedDataParallel calls it for CPU models whose
// largest gradient has at least 4 MiB, at that size
// (DDPOptions::malloc_mmap_threshold_mb).
MallocTuning fix_malloc_thresholds(double mmap_threshold_mb);

}  // namespace ddp
