// The error after a backward in which some parameter got no gradient:
// which parameters, and what DistributedDataParallel can tell about why
// (Reducer::set_no_gradient_advice). As PyTorch, the backward itself
// returns; the next forward throws it (Reducer::prepare_for_forward).
#include "parallel/reducer/reducer_impl.h"

#include <sstream>


namespace ddp {

void Reducer::set_no_gradient_advice(NoGradientAdvice advice) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->no_gradient_advice = std::move(advice);
}

// A bucket that never launched: some parameter got no gradient. The
// launched ones are waited for, and the error is kept for the next forward.
bool Reducer::Impl::check_every_bucket_launched() {
  if (next_bucket == buckets.size()) return true;
  std::ostringstream missing;
  std::vector<std::string> missing_names;
  for (size_t i = 0; i < params.size(); ++i)
    if (!marked[i]) {
      missing << (missing_names.empty() ? "" : ", ") << "'" << names[i] << "'";
      missing_names.push_back(names[i]);
    }
  const size_t count = missing_names.size();
  wait_for_launched_buckets();
  reset_iteration();
  std::ostringstream error;
  error << who() << "expected to have finished reduction in the prior iteration before starting a new one: ";
  if (options.static_graph()) {
    error << "its backward finished, but " << count << " parameter(s) received fewer gradients than in the first "
          << "iteration, so the gradient reduction could not finish: " << missing.str()
          << ".\n  The training graph changed, which static_graph(true) does not allow; construct "
             "DistributedDataParallel without static_graph (with find_unused_parameters(true) if some "
             "parameters go unused in some iterations).";
  } else {
    std::string advice = no_gradient_advice ? no_gradient_advice(missing_names) : std::string();
    if (advice.empty())
      advice = "Either make every parameter contribute to the loss, or construct with "
               "ddp::DDPOptions().find_unused_parameters(true).";
    error << "its backward finished, but " << count
          << " parameter(s) received no gradient, so the gradient reduction could not finish: " << missing.str()
          << ".\n  " << advice;
  }
  unfinished_reduction = error.str();
  return false;
}

}  // namespace ddp
