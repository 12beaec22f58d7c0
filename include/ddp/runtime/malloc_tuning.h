// glibc malloc and CPU training: keeping one step's memory between steps
// (on by default), and fixed thresholds for models with large gradients
// (opt-in).
//
// Keeping a step's memory. At the end of a step every activation and
// temporary is freed; glibc returns the free top of its heap to the system
// once it exceeds the trim threshold (dynamic: twice the largest freed
// mmap()ed block; 128 KiB at start), and the next step faults every page of
// it back in. Plain local training escapes this by luck: its .grad tensors,
// allocated during the first backward, sit above the activations and pin the
// heap's top. With gradients as bucket views nothing does, and a small model
// pays thousands of page faults and several milliseconds of system time per
// step, on whichever rank's heap happens to be laid out that way (the
// bistable slow regime of docs/performance.md, "Small models").
// retain_step_memory() feeds glibc's own dynamic rule one large freed block,
// so that its trim threshold holds a whole step. No setting changes, the
// thresholds stay dynamic, and models whose forward keeps more than 32 MiB
// alive are left as they are.
//
// Fixed thresholds.
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

// Bytes malloc has handed out and not taken back, in all arenas and in
// mmap()ed blocks; 0 where the C library cannot tell.
std::size_t malloc_bytes_in_use();

struct HeapRetention {
  bool applied = false;
  std::string reason;        // why not, when not applied; what was done when applied
  std::size_t threshold = 0;  // glibc's dynamic mmap threshold now (its trim threshold: twice)
};

// Raises glibc's dynamic mmap threshold to its ceiling (32 MiB) and with it
// the trim threshold to 64 MiB, by allocating and freeing one mmap()ed block
// of that size: what freeing any tensor of that size does. A step's heap
// spans several times what its forward keeps alive (4.6x measured on a small
// convolutional net: activations, their gradients, the convolutions'
// buffers and the holes between them), so nothing lower holds it reliably.
// Not applied where the user chose malloc settings in the environment, where
// fix_malloc_thresholds() applied (the thresholds are no longer dynamic),
// where forward_bytes (what a forward keeps alive) exceeds 32 MiB (such steps
// outgrow the ceiling, and their compute dwarfs their page faults), or where
// the C library is not glibc. DistributedDataParallel calls it once, after
// the first forward that builds a graph on a CPU model whose largest
// gradient is under 4 MiB (DDPOptions::retain_step_memory; with larger
// gradients the heap would keep the holes their temporaries leave).
HeapRetention retain_step_memory(std::size_t forward_bytes);

}  // namespace ddp
