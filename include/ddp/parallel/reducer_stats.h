// What DistributedDataParallel's reducer measured: ReducerStats, read
// through model.stats() after a backward (the bytes and buckets reduced, the
// time backward and communication took and how much of it overlapped, the
// bucket cap in effect).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ddp {

// What the last synchronised step cost, readable after backward.
struct ReducerStats {
  int64_t iterations = 0;          // synchronised backward passes so far
  int64_t bytes_reduced = 0;       // gradient bytes all-reduced in the last one
  size_t num_buckets = 0;
  size_t num_buckets_reduced = 0;  // in the last one: all but those skip_all_reduce_unused_params left out
  std::vector<int64_t> bucket_bytes;  // per bucket, in launch order
  double backward_ms = 0;          // first gradient ready -> end of backward
  // Waiting for communication after backward finished. It includes waiting
  // for slower ranks to reach their last bucket: the minimum over ranks is
  // the communication cost itself, the spread is rank skew.
  double exposed_comm_ms = 0;
  // The buckets follow the order gradients really became ready (rebuilt
  // after the first iteration, or kept when that order packs the same buckets).
  bool buckets_rebuilt = false;

  // As the runtime part of PyTorch's DDP logging data, for the last
  // synchronised step, in ms on this rank's clock:
  double forward_ms = 0;           // DDP forward entered -> its output ready
  double backward_compute_ms = 0;  // output ready -> end of backward
  double comm_ms = 0;              // first bucket launched -> last bucket done
  double overlap_ms = 0;           // first bucket launched -> end of backward (0 if none launched before)
  // Their means over every synchronised step so far (PyTorch samples some
  // steps; these cost two clock reads a step), and the exposed
  // communication's.
  struct Means {
    double forward_ms = 0, backward_compute_ms = 0, comm_ms = 0, overlap_ms = 0, exposed_comm_ms = 0;
  } mean;
  // When those spans began and ended, ns since the epoch on the system clock
  // (PyTorch's *_time_start / *_time_end); 0: no such moment (no bucket launched).
  struct Moments {
    int64_t forward_start = 0, backward_compute_start = 0, backward_compute_end = 0, comm_start = 0, comm_end = 0;
  } at_ns;
  // Bytes of the parameters found unused in the last step (find_unused_parameters).
  int64_t unused_parameter_bytes = 0;
  // The order gradients became ready in the last synchronised step (parameter indices).
  std::vector<size_t> ready_order;

  // The bucket cap in effect, MiB; with bucket_cap_mb("auto"), the current
  // candidate while tuning and the chosen one after.
  double bucket_cap_mb = 0;
  bool bucket_cap_tuning = false;  // "auto" has not chosen yet
  // "auto": each candidate cap tried and its agreed cost (the slowest rank's
  // median backward plus exposed communication), ms; filled once it chose.
  std::vector<std::pair<double, double>> bucket_cap_trials;
};

}  // namespace ddp
