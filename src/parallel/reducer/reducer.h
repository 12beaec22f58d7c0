// The bucketed reducer behind DistributedDataParallel: groups gradients
// into buckets and reduces each bucket asynchronously (the comm hook; the
// built-in one all-reduces) the moment its last gradient is accumulated,
// while backward still runs; at the end of backward it waits and leaves
// averages in .grad. Private: users reach it through
// DistributedDataParallel, tests through this header. Its state and parts
// are in reducer_impl.h.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/parallel/comm_hook.h"
#include "ddp/parallel/ddp_options.h"
#include "ddp/parallel/reducer_stats.h"

namespace ddp {

class Timeline;

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
  // (ddp/parallel/comm_hook.h). Once, before the first synchronised backward.
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
  // collectives (zeros for each bucket, in bucket order, through the same
  // hook as theirs; the used-parameter map with find_unused_parameters).
  void join_shadow_forward();
  void join_shadow_backward();

  // After the group re-formed (ddp/comm/recovery.h): the iteration that
  // failed is dropped (its launched reductions waited for, their failures
  // ignored), and the next forward lays the buckets out in the order of the
  // new rank 0, so that every rank's buckets match again.
  void abandon_iteration();
  const ReducerStats& stats() const;
  // Bucket membership as parameter indices, in launch order (for tests and docs).
  std::vector<std::vector<size_t>> bucket_indices() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // hooks hold weak references to it
};

}  // namespace ddp
