// Options of DistributedDataParallel, named as PyTorch's constructor arguments.
#pragma once

#include <torch/arg.h>

namespace ddp {

struct DDPOptions {
  // Gradients are all-reduced in buckets that close once they hold this many
  // MiB (a parameter is never split). As PyTorch 1.13, the first iteration
  // uses one bucket per dtype unless find_unused_parameters is on; buckets
  // are rebuilt in the real ready order after it.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  // The first bucket (the last layers' gradients, ready first) is smaller so
  // that communication starts early. PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES.
  TORCH_ARG(double, first_bucket_mb) = 1.0;
  // Before the first forward of each gradient-accumulation cycle, every rank
  // takes rank 0's buffers (BatchNorm's running stats).
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Parameters outside this iteration's autograd graph count as ready with a
  // zero gradient; costs a graph traversal and one small all-reduce a step.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // .grad aliases the bucket storage: no copy in or out, and no second copy
  // of every gradient in memory. On by default here (off in PyTorch) because
  // it is faster and smaller; see docs/design.md.
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  // CPU models only: fix glibc's malloc thresholds, once per process, so that
  // freed gradient-sized temporaries leave RSS (ddp/malloc_tuning.h).
  // Negative (the default): at the largest gradient's size when that is at
  // least 4 MiB, else leave malloc alone; positive: at this many MiB; 0:
  // never. DDP_MALLOC_MMAP_THRESHOLD_MB overrides this value, and any
  // MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
  // MALLOC_MMAP_MAX_ or glibc.malloc.* tunable in the environment wins over
  // both. Not in PyTorch; see docs/design.md.
  TORCH_ARG(double, malloc_mmap_threshold_mb) = -1.0;
};

}  // namespace ddp
