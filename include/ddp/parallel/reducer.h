// The bucketed reducer: groups gradients into buckets and all-reduces each
// bucket asynchronously the moment its last gradient is accumulated, while
// backward still runs; at the end of backward it waits and leaves averages
// in .grad. The machinery behind DistributedDataParallel.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/parallel/comm_hook.h"
#include "ddp/parallel/ddp_options.h"
#include "ddp/comm/process_group.h"

namespace ddp {

class Timeline;

// What the last synchronised step cost, readable after backward.
struct ReducerStats {
  int64_t iterations = 0;          // synchronised backward passes so far
  int64_t bytes_reduced = 0;       // gradient bytes all-reduced in the last one
  size_t num_buckets = 0;
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

class Reducer {
 public:
  // `params` are the parameters that require grad, each tensor once, and
  // `names` their dotted names.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> pg,
          const DDPOptions& options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by DistributedDataParallel before and after the wrapped forward.
  void prepare_for_forward();
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);

  // Whether the next backward synchronises (no_sync turns it off).
  void set_sync(bool sync);
  bool sync() const;

  // Reduces each bucket with `hook` instead of the built-in all-reduce
  // (ddp/comm_hook.h). Once, before the first synchronised backward.
  void register_comm_hook(CommHook hook);
  bool has_comm_hook() const;

  // What the error says when a backward ends with parameters that received
  // no gradient: advice(their names) follows the list of names.
  // DistributedDataParallel's looks at the module for the likely cause (a
  // layer's member reassigned away from its registered tensor).
  using NoGradientAdvice = std::function<std::string(const std::vector<std::string>& names)>;
  void set_no_gradient_advice(NoGradientAdvice advice);

  // Records each backward's buckets on `timeline` (null: stop).
  void set_timeline(std::shared_ptr<Timeline> timeline);
  // ddp::Join (ddp/parallel/join.h). `nonjoined` is this forward's count of the ranks
  // still training; with divide_by_nonjoined the next synchronised backward
  // divides by it instead of the world size (PyTorch's
  // _set_forward_pass_work_handle).
  void set_forward_pass_work(CommFuture nonjoined, bool divide_by_nonjoined);
  // A rank that ran out of inputs, in step with the others: the rebuild
  // broadcast their forward may do, and their synchronised backward's
  // collectives (zeros for each bucket, in bucket order, through the comm hook
  // if any; the used-parameter map with find_unused_parameters).
  void join_shadow_forward();
  void join_shadow_backward();

  const ReducerStats& stats() const;
  // Bucket membership as parameter indices, in launch order (for tests and docs).
  std::vector<std::vector<size_t>> bucket_indices() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // hooks hold weak references to it
};

// Bucket assignment, exposed for tests; PyTorch 1.13's rules. Parameters are
// taken in `order` and packed into buckets of one dtype and device each; per
// dtype and device, the first bucket closes once it holds at least first_cap
// bytes, the later ones at cap; a parameter is never split. Buckets come back
// in the order they become ready in `order` (by their last member), which is
// the order the reducer launches them in.
std::vector<std::vector<size_t>> compute_bucket_assignment(const std::vector<at::Tensor>& params,
                                                           const std::vector<size_t>& order, int64_t first_cap,
                                                           int64_t cap);

// The buckets DistributedDataParallel starts with, before the real ready order
// is known, as PyTorch 1.13's constructor: packed in registration order (one
// bucket per dtype when find_unused_parameters is off, else first_cap then
// cap), then reversed, since gradients arrive roughly last layer first.
std::vector<std::vector<size_t>> initial_bucket_assignment(const std::vector<at::Tensor>& params, int64_t first_cap,
                                                           int64_t cap, bool find_unused_parameters);

// The first bucket's cap in effect, MiB: first_bucket_mb when given; else,
// built against LibTorch 2.x with a bucket_cap_mb given (a number), that cap,
// as PyTorch 2.x's DDP (its small first bucket, dist._DEFAULT_FIRST_BUCKET_BYTES,
// comes only with the default cap); else first_bucket_mb's default, 1 MiB,
// as PyTorch 1.13 always.
double first_bucket_mb_in_effect(const DistributedDataParallelOptions& options);

}  // namespace ddp
