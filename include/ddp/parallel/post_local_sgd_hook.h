// Post-local SGD as a communication hook: PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook. For the
// first start_localSGD_iter iterations gradients are averaged over the whole
// group, as allreduce_hook; from then on only within a subgroup (by default
// the ranks of one node), or not at all, while a model averager
// (ddp/optim/model_averaging.h) averages the parameters globally now and
// then, after the optimizer's step.
//
//   model.register_comm_hook(ddp::hooks::PostLocalSGDState(nullptr, nullptr, 100),
//                            ddp::hooks::post_localSGD_hook);
//   ddp::PostLocalSGDOptimizer opt(std::make_shared<torch::optim::SGD>(net->parameters(), 0.01),
//                                  std::make_shared<ddp::PeriodicModelAverager>(4, 100));
#pragma once

#include <cstdint>
#include <memory>

#include "ddp/comm/process_group.h"
#include "ddp/parallel/comm_hook.h"

namespace ddp::hooks {

// What post_localSGD_hook needs and counts, as PyTorch's PostLocalSGDState.
// One state for all buckets of one model; register_comm_hook moves it in.
class PostLocalSGDState {
 public:
  // process_group: the group gradients are averaged over before
  // start_localSGD_iter (null: the default group). subgroup: the one they
  // are averaged over afterwards; null: this node's ranks
  // (dist::new_subgroups()), made by every rank in the first iteration of
  // local SGD. post_local_gradient_allreduce false: no gradient averaging at
  // all after start_localSGD_iter, only the averager's.
  PostLocalSGDState(std::shared_ptr<ProcessGroup> process_group, std::shared_ptr<ProcessGroup> subgroup,
                    int64_t start_localSGD_iter, bool post_local_gradient_allreduce = true);

  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  // Null until made, when the state was given none.
  const std::shared_ptr<ProcessGroup>& subgroup() const { return subgroup_; }
  int64_t start_localSGD_iter() const { return start_localSGD_iter_; }
  bool post_local_gradient_allreduce() const { return post_local_gradient_allreduce_; }
  // Iterations (backward passes) seen before local SGD began, PyTorch's
  // state.iter: counted at the last bucket of each, up to start_localSGD_iter.
  int64_t iter() const { return iter_; }

 private:
  friend CommFuture post_localSGD_hook(PostLocalSGDState& state, GradBucket& bucket);
  void maybe_increase_iter(const GradBucket& bucket);

  std::shared_ptr<ProcessGroup> process_group_;
  std::shared_ptr<ProcessGroup> subgroup_;
  int64_t start_localSGD_iter_;
  bool post_local_gradient_allreduce_;
  int64_t iter_ = 0;
};

// Before start_localSGD_iter: allreduce_hook over the state's process group.
// From then on: allreduce_hook over the subgroup, or the bucket as it is
// when post_local_gradient_allreduce is false.
CommFuture post_localSGD_hook(PostLocalSGDState& state, GradBucket& bucket);

}  // namespace ddp::hooks
