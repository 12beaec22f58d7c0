// The reducer's state, as one struct of parts, each owning its own:
//   BucketSet        the buckets, their views and collectives (bucket_set.h)
//   ParameterUsage   unused parameters, dynamic and static (parameter_usage.h)
//   GraphTasks       which graph task's end finalizes (graph_tasks.h)
//   JoinDivisor      what gradients are divided by under ddp::Join (below)
//   Observers        runtime figures, timeline, stall inspector, bucket-size
//                    search (observers.h)
// and the few fields of the step itself. reducer.cpp is the hot path (hook ->
// mark ready -> launch -> finalize) and the public Reducer; join_shadow.cpp is
// a joined rank's side of a step; missing_gradients.cpp the error when some
// parameter got no gradient. Private to src/parallel/reducer/.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/reducer/bucket_assignment.h"
#include "parallel/reducer/reducer.h"
#include "parallel/reducer/bucket_set.h"
#include "parallel/reducer/graph_tasks.h"
#include "parallel/reducer/observers.h"
#include "parallel/reducer/parameter_usage.h"

namespace ddp {

namespace detail {

// As PyTorch's set_divide_factor: the world size, or under ddp::Join with
// divide_by_initial_world_size(false) the ranks still training, read (once
// a backward) from the count the forward launched.
class JoinDivisor {
 public:
  void set_forward_count(CommFuture nonjoined, bool divide_by_nonjoined);
  int64_t get(int64_t world_size);
  void reset() { factor_ = 0; }

 private:
  CommFuture nonjoined_;
  bool divide_by_nonjoined_ = false;
  int64_t factor_ = 0;  // 0: not read yet this backward
};

}  // namespace detail

struct Reducer::Impl : std::enable_shared_from_this<Impl> {
  Impl(std::vector<at::Tensor> params, std::vector<std::string> names, std::shared_ptr<ProcessGroup> pg,
       const DDPOptions& options);

  // ---- what it reduces, and how
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::shared_ptr<ProcessGroup> pg;
  DDPOptions options;
  std::vector<detail::AccumulatorPtr> accumulators;  // keeps our hooks alive across iterations
  at::Tensor inverse_world;  // 1/W as a wrapped scalar, as PyTorch's mul_out takes it
  // Every bucket is reduced through a hook, as c10d's reducer: the one
  // registered (empty: none), else the built-in allreduce_by_sum.
  CommHook comm_hook;
  bool hook_registered() const { return static_cast<bool>(comm_hook); }
  NoGradientAdvice no_gradient_advice;  // empty: the generic advice (missing_gradients.cpp)
  // As PyTorch's ensure_prior_reduction_finished: a backward that left a
  // bucket unreduced raises nothing; every forward after it throws this
  // (empty: the last backward finished). unfinished_raised: one did.
  std::string unfinished_reduction;
  bool unfinished_raised = false;

  ReducerStats stats;  // before the observers, which write it

  // ---- the parts
  detail::BucketSet buckets;
  detail::ParameterUsage usage;
  detail::GraphTasks graph_tasks;
  detail::JoinDivisor divisor;
  detail::Observers observers;
  detail::TimelineRecorder* timeline = nullptr;   // in observers once a timeline was set (DDP_TIMELINE)
  detail::BucketCapSearch* cap_search = nullptr;  // in observers; null: a fixed bucket_cap_mb

  // ---- this step
  size_t next_bucket = 0;      // buckets launch strictly in order, the same on every rank
  std::vector<char> marked;    // ready this backward
  std::vector<size_t> skipped;  // buckets not reduced this backward (skip_all_reduce_unused_params)
  // Left in .grad this backward: a group of one without a hook has nothing
  // to reduce, and one rank's average is its own gradient, bit for bit.
  std::vector<char> kept_in_grad;
  bool unused_marked = false;  // the parameters known unused were marked ready in this backward
  bool readying_unused = false;  // mark_ready() is called for a parameter this rank did not use
  bool sync = true;
  bool expect_hooks = false;  // a DDP forward prepared this backward
  bool backward_started = false;
  uint64_t generation = 0;  // counts prepared backwards
  std::vector<size_t> step_ready_order;  // this backward's, every hook

  // ---- the rebuild: buckets that follow the order gradients became ready
  bool rebuilt = false;          // buckets follow a recorded ready order
  bool rebuild_pending = false;  // the first synchronised backward finished: rebuild before the next forward
  std::vector<size_t> ready_order;   // recorded for the rebuild
  std::vector<size_t> layout_order;  // the agreed ready order (empty: registration order reversed)

  mutable std::mutex mutex;

  std::string who() const { return "rank " + std::to_string(pg->rank()) + ": DistributedDataParallel: "; }
  // As PyTorch 1.13: a static graph rebuilds after its second iteration
  // (the first records no ready order), whatever find_unused_parameters says.
  bool should_rebuild() const { return !rebuilt && (options.static_graph() || !options.find_unused_parameters()); }

  // reducer.cpp: the hot path
  void register_hooks();
  void autograd_hook(size_t i);
  void arm_end_of_graph_task();
  void end_of_graph_task(const void* task);
  void mark_ready(size_t i);
  void copy_grad_to_bucket(size_t i, at::Tensor view);
  void launch_ready_buckets(bool may_skip = true);
  bool skips(size_t k) const;
  CommFuture launch(size_t k, const at::Tensor& contents);
  CommFuture allreduce_by_sum(const at::Tensor& bucket);
  void reduce_after_first_static_backward();
  void finalize_backward();
  int64_t mark_unused_ready();
  // False when some parameter got no gradient: the launched buckets are
  // waited for, and unfinished_reduction says which parameters (missing_gradients.cpp).
  bool check_every_bucket_launched();
  detail::Clock::time_point wait_for_buckets();  // returns when the last wait ended
  void take_hook_result(size_t index, const at::Tensor& result);
  void copy_results_to_grads();
  std::string wait_for_launched_buckets();
  void settle_unfinished();
  void reset_iteration();
  // reducer.cpp: the bucket layout, between steps
  void lay_out(const detail::Assignment& assignment);
  detail::Assignment layout_for(double cap_mb) const;
  void rebuild_and_apply_cap();
  // join_shadow.cpp
  void shadow_backward();
};

}  // namespace ddp
