// Options of DistributedDataParallel, named as PyTorch's constructor
// arguments, in LibTorch's style (as Conv2dOptions, SGDOptions):
//
//   ddp::DistributedDataParallelOptions().bucket_cap_mb(25).find_unused_parameters(true)
//
// A value that cannot work (a bucket of 0 MiB) is a UsageError where it is
// set, before any collective.
#pragma once

#include <torch/arg.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddp/errors.h"

namespace ddp {

struct DistributedDataParallelOptions {
  // Gradients are all-reduced in buckets that close once they hold this many
  // MiB (a parameter is never split). As PyTorch 1.13, the first iteration
  // uses one bucket per dtype unless find_unused_parameters is on; buckets
  // are rebuilt in the real ready order after it. Must be > 0.
  DistributedDataParallelOptions& bucket_cap_mb(double mb) {
    bucket_cap_mb_ = positive_mb("bucket_cap_mb", mb);
    bucket_cap_auto_ = false;
    bucket_cap_mb_given_ = true;
    bucket_cap_mb_list_.clear();
    return *this;
  }
  double bucket_cap_mb() const { return bucket_cap_mb_; }
  // Whether bucket_cap_mb was given (a number): against LibTorch 2.x the
  // first bucket then takes that cap too, unless first_bucket_mb is given.
  bool bucket_cap_mb_given() const { return bucket_cap_mb_given_; }
  // "auto" (not in PyTorch; Horovod's autotune for its fusion buffer): once
  // the buckets follow the real ready order, DDP tries each candidate cap
  // (bucket_cap_candidates_mb, those that pack different buckets) for a few
  // synchronised steps, keeps the one with the shortest backward plus
  // exposed communication (the slowest rank's, agreed by one all-reduce), and
  // uses it from then on (ReducerStats::bucket_cap_mb, bucket_cap_trials). A
  // number as text is the same as bucket_cap_mb(number). Anything else is a
  // UsageError.
  DistributedDataParallelOptions& bucket_cap_mb(const std::string& value) {
    if (value == "auto") {
      bucket_cap_auto_ = true;
      bucket_cap_mb_list_.clear();
      return *this;
    }
    size_t used = 0;
    double mb = std::nan("");
    try {
      mb = std::stod(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != value.size())
      throw UsageError("DistributedDataParallelOptions: bucket_cap_mb must be a positive number of MiB or \"auto\", got \"" +
                       value + "\"");
    bucket_cap_auto_ = false;
    return bucket_cap_mb(mb);
  }
  bool bucket_cap_auto() const { return bucket_cap_auto_; }
  // One cap per bucket, MiB, as PyTorch 2.x's bucket_cap_mb_list: bucket i
  // (in launch order, per dtype) closes at caps[i], the last cap repeating,
  // from the first iteration on and after the rebuild; bucket_cap_mb becomes
  // the largest. Each must be > 0; an empty list is the same as none. A later
  // bucket_cap_mb(...) replaces it; with first_bucket_mb given as well,
  // DistributedDataParallel's constructor throws a UsageError (give one).
  DistributedDataParallelOptions& bucket_cap_mb_list(std::vector<double> caps) {
    for (double mb : caps) positive_mb("bucket_cap_mb_list", mb);
    if (!caps.empty()) {
      bucket_cap_mb_ = *std::max_element(caps.begin(), caps.end());
      bucket_cap_auto_ = false;
      bucket_cap_mb_given_ = true;
    }
    bucket_cap_mb_list_ = std::move(caps);
    return *this;
  }
  const std::vector<double>& bucket_cap_mb_list() const { return bucket_cap_mb_list_; }
  // The caps "auto" tries, in MiB (positive; checked when the model is
  // wrapped). Those that pack different buckets than an earlier one are
  // visited in this order, then in reverse order; each visit runs
  // kAutoBucketCapWarmupSteps steps that are not counted (none where the
  // order turns), then kAutoBucketCapTimedSteps timed ones; a candidate's
  // cost is the median of its timed steps. With the defaults and a model
  // that fills them, 41 steps.
  TORCH_ARG(std::vector<double>, bucket_cap_candidates_mb) = std::vector<double>{1, 2, 5, 10, 25, 50, 100};

 public:
  static constexpr int kAutoBucketCapWarmupSteps = 1;
  static constexpr int kAutoBucketCapTimedSteps = 2;
  // The first bucket (the last layers' gradients, ready first) is smaller so
  // that communication starts early. PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES.
  // Must be > 0. Not given, it is 1 MiB; built against LibTorch 2.x, where
  // PyTorch's DDP keeps the small first bucket for its default cap only, a
  // given bucket_cap_mb is the first bucket's cap too
  // (ddp::first_bucket_mb_in_effect, docs/gpu.md).
  DistributedDataParallelOptions& first_bucket_mb(double mb) {
    first_bucket_mb_ = positive_mb("first_bucket_mb", mb);
    first_bucket_mb_given_ = true;
    return *this;
  }
  double first_bucket_mb() const { return first_bucket_mb_; }
  bool first_bucket_mb_given() const { return first_bucket_mb_given_; }
  // Before the first forward of each gradient-accumulation cycle, every rank
  // takes rank 0's buffers (BatchNorm's running stats).
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Parameters and buffers that DDP leaves alone, by the names
  // named_parameters() and named_buffers() give them ("fc2.weight",
  // "bn.running_mean"): not compared across ranks, not broadcast from rank 0
  // (at construction, before forwards, or by Join), not reduced; their
  // gradients stay this rank's own. For a layer that differs by rank, or one
  // replaced after wrapping. PyTorch's
  // DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names).
  // A name that matches nothing is warned about.
  TORCH_ARG(std::vector<std::string>, params_and_buffers_to_ignore) = {};
  // As PyTorch 2.x's skip_all_reduce_unused_params: with
  // find_unused_parameters (or static_graph), a bucket whose parameters all
  // went unused on this rank is not all-reduced; their gradients stay as
  // PyTorch leaves an unused parameter's. Only for parameters unused on every
  // rank alike, every iteration: a bucket one rank skips and another reduces
  // stalls both until the process group's timeout.
  TORCH_ARG(bool, skip_all_reduce_unused_params) = false;
  // Parameters outside this iteration's autograd graph count as ready with a
  // zero gradient; costs a graph traversal and one small all-reduce a step.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // The graph is the same every iteration (the same parameters get
  // gradients, each as many times): as PyTorch's static_graph. The first
  // synchronised iteration records which parameters get gradients and how
  // often (a reentrant backward, as activation checkpointing runs, may
  // deliver one parameter's gradient twice) and reduces everything after its
  // backward; later iterations overlap as usual, find unused parameters
  // without a graph search or a per-step collective, and may reuse a
  // parameter in several reentrant backward passes. A graph that changes
  // afterwards is a UsageError naming the parameter.
  TORCH_ARG(bool, static_graph) = false;
  // When this rank has waited this many seconds for a bucket's all-reduce,
  // it prints which ranks have not launched the bucket and which parameters
  // the bucket holds (Horovod's stall inspector); the process group's
  // timeout still ends the job. 0 turns it off; kept below that timeout;
  // DDP_STALL_CHECK_TIME_SECONDS overrides. Not in PyTorch.
  TORCH_ARG(double, stall_check_seconds) = 60.0;
  // .grad aliases the bucket storage: no copy in or out, and no second copy
  // of every gradient in memory. On by default here (off in PyTorch) because
  // it is faster and smaller; see docs/design.md. The values are PyTorch's
  // either way: left at its default, a gradient already in its bucket is
  // scaled as PyTorch's default (copying) scales it, by 1/W; given true, it
  // is divided by W, as PyTorch's gradient_as_bucket_view=True does (the two
  // differ in the last bit at world sizes that are not powers of two).
 public:
  DistributedDataParallelOptions& gradient_as_bucket_view(bool as_view) {
    gradient_as_bucket_view_ = as_view;
    gradient_as_bucket_view_given_ = true;
    return *this;
  }
  bool gradient_as_bucket_view() const { return gradient_as_bucket_view_; }
  bool gradient_as_bucket_view_given() const { return gradient_as_bucket_view_given_; }
  // CPU models only, opt-in: fix glibc's malloc thresholds, once per process,
  // so that freed gradient-sized temporaries leave RSS (ddp/runtime/malloc_tuning.h).
  // 0 (the default): leave them to glibc; negative (-1, "auto"): at the
  // largest gradient's size when that is at least 4 MiB, else leave them;
  // positive: at this many MiB. It saves resident memory on models with large
  // gradients and costs CPU on every step (docs/performance.md).
  // DDP_MALLOC_MMAP_THRESHOLD_MB overrides this value, and any
  // MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
  // MALLOC_MMAP_MAX_ or glibc.malloc.* tunable in the environment wins over
  // both. Not in PyTorch; see docs/reducer.md, "DistributedDataParallel".
  TORCH_ARG(double, malloc_mmap_threshold_mb) = 0.0;
  // CPU models only: after the first forward that builds a graph, let glibc
  // keep one step's memory between steps instead of returning it and
  // faulting it back in on every step, when that forward keeps at most
  // 32 MiB alive and the largest gradient is under 4 MiB
  // (ddp::retain_step_memory in ddp/runtime/malloc_tuning.h). Not in PyTorch, whose
  // Python heap keeps it by accident; see docs/reducer.md, "DistributedDataParallel".
  TORCH_ARG(bool, retain_step_memory) = true;

 private:
  static double positive_mb(const char* name, double mb) {
    if (!(mb > 0) || !std::isfinite(mb))
      throw UsageError(std::string("DistributedDataParallelOptions: ") + name + " must be a positive number of MiB, got " +
                       std::to_string(mb));
    return mb;
  }
  double bucket_cap_mb_ = 25.0;
  bool bucket_cap_auto_ = false;
  double first_bucket_mb_ = 1.0;
  bool first_bucket_mb_given_ = false;
  bool bucket_cap_mb_given_ = false;
  bool gradient_as_bucket_view_ = true;
  bool gradient_as_bucket_view_given_ = false;
  std::vector<double> bucket_cap_mb_list_;
};

// The short name this project used first; the same type.
using DDPOptions = DistributedDataParallelOptions;

// The first bucket's cap in effect, MiB: first_bucket_mb when given; else,
// built against LibTorch 2.x with a bucket_cap_mb given (a number), that cap,
// as PyTorch 2.x's DDP (its small first bucket, dist._DEFAULT_FIRST_BUCKET_BYTES,
// comes only with the default cap); else first_bucket_mb's default, 1 MiB,
// as PyTorch 1.13 always.
double first_bucket_mb_in_effect(const DistributedDataParallelOptions& options);

// The buckets' caps in effect, bytes, for a cap of cap_mb: bucket_cap_mb_list
// when given; else first_bucket_mb_in_effect, then cap_mb. UsageError for
// first_bucket_mb with bucket_cap_mb_list.
std::vector<int64_t> bucket_limits_in_effect(const DistributedDataParallelOptions& options, double cap_mb);

}  // namespace ddp
