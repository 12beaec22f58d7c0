// A gradient's way into its bucket and the average's way back to .grad:
// PyTorch's mark_variable_ready_dense and finalize_bucket_dense, bit for bit
// (which scaling, 1/W or a division by W, which copies, what a parameter no
// rank used keeps). Steps 2 and 4 of reducer.cpp call them.
#include "parallel/reducer/reducer_impl.h"

#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/utils/grad_layout_contract.h>

#include "usage_check.h"

namespace ddp {

// As PyTorch's mark_variable_ready_dense: a gradient that is not already
// the bucket view is scaled by 1/W on its way in (one pass); one that is
// is divided by W in place, or, with gradient_as_bucket_view left at our
// default, multiplied by 1/W in place, the bits of PyTorch's default
// (copying) DDP; a missing one contributes zeros.
void Reducer::Impl::copy_grad_to_bucket(size_t i, at::Tensor view) {
  torch::NoGradGuard no_grad;
  auto& grad = params[i].mutable_grad();
  if (!grad.defined()) {
    view.zero_();
    return;
  }
  check_usage(!grad.is_sparse(), who(), "parameter '", names[i],
              "' received a sparse gradient; only dense gradients are supported (construct embeddings with "
              "sparse(false))");
  check_usage(grad.scalar_type() == view.scalar_type(), who(), "parameter '", names[i], "' received a ",
              grad.scalar_type(), " gradient, expected ", view.scalar_type());
  const bool as_view = options.gradient_as_bucket_view();
  if (hook_registered()) {
    // As PyTorch: with a hook the gradients go in as they are; dividing
    // by the world size is the hook's business.
    if (!detail::BucketSet::is_alias(grad, view)) {
      view.copy_(grad.detach());
      if (as_view) grad = view;
    }
    return;
  }
  const int64_t div = divisor.get(pg->size());
  const at::Tensor scale = div == pg->size() ? inverse_world : at::native::wrapped_scalar_tensor(1.0 / div);
  if (div == 1 && pg->size() == 1 && !grad.requires_grad()) {
    // A group of one: no copy into the bucket and none back (on a GPU,
    // two kernels a parameter saved); the bucket's slot stays unused.
    if (kept_in_grad.empty()) kept_in_grad.assign(params.size(), 0);
    kept_in_grad[i] = 1;
    return;
  }
  if (readying_unused && as_view && !options.gradient_as_bucket_view_given() &&
      detail::BucketSet::is_alias(grad, view)) {
    // PyTorch's default DDP copies gradients into its buckets, so a parameter
    // no rank used keeps its gradient bit for bit (a round trip through the
    // bucket, 1/W and a sum, would not at every world size): it leaves the
    // bucket for this step, and comes back if another rank used it.
    grad = grad.clone();
    view.mul_(scale);
    return;
  }
  if (!detail::BucketSet::is_alias(grad, view)) {
    if (grad.requires_grad())
      view.copy_(grad.detach().div(div));
    else
      at::mul_out(view, grad, scale);
    if (as_view) grad = view;
  } else if (div > 1) {
    if (options.gradient_as_bucket_view_given()) view.div_(div);
    else view.mul_(scale);
  }
}

void Reducer::Impl::copy_results_to_grads() {
  usage.read_used_map();
  const bool as_view = options.gradient_as_bucket_view();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!usage.reduced_gradient_applies(i)) continue;
    if (!kept_in_grad.empty() && kept_in_grad[i]) continue;
    const auto& view = buckets.view_of(i);
    auto& grad = params[i].mutable_grad();
    if (as_view) {
      if (!detail::BucketSet::is_alias(grad, view)) grad = view;
    } else if (!grad.defined()) {
      grad = torch::autograd::utils::clone_obey_contract(view, params[i]);
    } else {
      grad.copy_(view);
    }
  }
  usage.end_step();
}

}  // namespace ddp
