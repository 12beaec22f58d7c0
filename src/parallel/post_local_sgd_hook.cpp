#include "ddp/parallel/post_local_sgd_hook.h"

#include "ddp/comm/dist.h"
#include "ddp/parallel/default_hooks.h"

namespace ddp::hooks {

PostLocalSGDState::PostLocalSGDState(std::shared_ptr<ProcessGroup> process_group,
                                     std::shared_ptr<ProcessGroup> subgroup, int64_t start_localSGD_iter,
                                     bool post_local_gradient_allreduce)
    : process_group_(std::move(process_group)),
      subgroup_(std::move(subgroup)),
      start_localSGD_iter_(start_localSGD_iter),
      post_local_gradient_allreduce_(post_local_gradient_allreduce) {}

void PostLocalSGDState::maybe_increase_iter(const GradBucket& bucket) {
  // Once an iteration: at the last bucket it reduces.
  if (bucket.is_last()) ++iter_;
}

CommFuture post_localSGD_hook(PostLocalSGDState& state, GradBucket& bucket) {
  if (state.iter_ < state.start_localSGD_iter_) {
    state.maybe_increase_iter(bucket);
    return allreduce_hook(state.process_group_, bucket);
  }
  if (!state.post_local_gradient_allreduce_) return CommFuture::ready(bucket.buffer());
  // Every rank reaches this bucket of this iteration, so every rank makes
  // the subgroups here together, as PyTorch does.
  if (!state.subgroup_) state.subgroup_ = dist::new_subgroups().first.process_group();
  return allreduce_hook(state.subgroup_, bucket);
}

}  // namespace ddp::hooks
