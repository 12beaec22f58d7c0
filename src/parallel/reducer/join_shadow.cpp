// A joined rank's side of a synchronised step (ddp::Join, ddp/parallel/join.h):
// the collectives the ranks still training launch, in their order, with
// zeros, so that theirs complete.
#include "parallel/reducer/reducer_impl.h"

#include <torch/torch.h>

namespace ddp {

void detail::JoinDivisor::set_forward_count(CommFuture nonjoined, bool divide_by_nonjoined) {
  if (nonjoined_.valid()) nonjoined_.wait();  // the last forward's count: every rank launched it
  nonjoined_ = std::move(nonjoined);
  divide_by_nonjoined_ = divide_by_nonjoined;
}

int64_t detail::JoinDivisor::get(int64_t world_size) {
  if (factor_ == 0) {
    factor_ = world_size;
    if (divide_by_nonjoined_ && nonjoined_.valid()) factor_ = static_cast<int64_t>(nonjoined_.wait().item<float>());
  }
  return factor_;
}

// Zeros for each bucket, in the order the others launch them, through the
// same comm hook, then the used map (the last one it reduced, as
// PyTorch's local_used_map_dev_); its rebuild order, if still pending, is
// the parameters' (PyTorch's _push_all_rebuilt_params).
void Reducer::Impl::shadow_backward() {
  torch::NoGradGuard no_grad;
  // The others' iteration counts as this rank's: a static graph's first
  // iteration reduces the used map first and rebuilds nothing, later ones
  // reduce no map.
  if (sync) usage.count_synchronised_forward();
  usage.shadow_first_iteration_map(*pg);
  std::vector<CommFuture> reduced;
  for (size_t k = 0; k < buckets.size(); ++k) reduced.push_back(launch(k, at::zeros_like(buckets[k].contents)));
  for (auto& f : reduced) f.wait();
  usage.shadow_used_map(*pg);
  if (should_rebuild() && !usage.static_first_iteration()) {
    if (ready_order.empty())
      for (size_t i = 0; i < params.size(); ++i) ready_order.push_back(i);
    rebuild_pending = true;
  }
  observers.each([](auto& o) { o.shadow_step_finished(); });
  const bool settled = !should_rebuild() && !rebuild_pending;
  observers.each([settled](auto& o) { o.between_steps(0, settled); });
}

}  // namespace ddp
