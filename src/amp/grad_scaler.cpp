// ddp::GradScaler: torch.cuda.amp.GradScaler's state machine (ready,
// unscaled, stepped per optimizer; one update per iteration) and its two
// kernels' arithmetic, with the inf/NaN flag all-reduced over the process
// group before anything depends on it.
#include "ddp/amp/grad_scaler.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ddp/errors.h"
#include "comm/c10d_compat.h"

namespace ddp {

namespace {

std::string who(const std::shared_ptr<ProcessGroup>& pg) {
  return pg ? "rank " + std::to_string(pg->rank()) + ": ddp::GradScaler" : std::string("ddp::GradScaler");
}

void check_options(const GradScalerOptions& o, const std::string& who) {
  if (!(o.init_scale() > 0) || !std::isfinite(o.init_scale()))
    throw UsageError(who + ": init_scale must be a positive finite number, not " + std::to_string(o.init_scale()));
  if (!(o.growth_factor() > 1.0) || !std::isfinite(o.growth_factor()))
    throw UsageError(who + ": growth_factor must be > 1 (PyTorch's rule), not " + std::to_string(o.growth_factor()));
  if (!(o.backoff_factor() > 0.0 && o.backoff_factor() < 1.0))
    throw UsageError(who + ": backoff_factor must be in (0, 1), not " + std::to_string(o.backoff_factor()));
  if (o.growth_interval() < 1 || o.growth_interval() > INT32_MAX)
    throw UsageError(who + ": growth_interval must be a positive int32, not " + std::to_string(o.growth_interval()));
}

// PyTorch's _unscale_grads_: the gradients of one device and dtype are
// checked and unscaled by one _amp_foreach_non_finite_check_and_unscale_
// call (found_inf becomes 1 where any element is inf or NaN; each element is
// multiplied by inv_scale in float32 arithmetic for float16/bfloat16, in its
// own dtype for float32/float64), with no read back to the host. Where
// LibTorch has no such kernel for the device (1.13 on CPU), the same
// arithmetic as tensor operations, also without a host read.
void check_and_unscale(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf,
                       const torch::Tensor& inv_scale) {
  if (grads.empty()) return;
  if (grads.front().is_cuda() || compat::kAmpUnscaleKernelOnCpu) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  const auto factor = inv_scale.reshape({});
  for (auto grad : grads) {
    found_inf.copy_(at::maximum(found_inf, at::logical_not(at::isfinite(grad)).any().to(found_inf.dtype())));
    grad.mul_(factor);
  }
}

}  // namespace

GradScaler::GradScaler(std::shared_ptr<ProcessGroup> pg, GradScalerOptions options)
    : pg_(std::move(pg)), options_(options) {
  if (options_.enabled()) check_options(options_, who(pg_));
}

void GradScaler::check_started(const char* what) const {
  if (!scale_.defined())
    throw UsageError(who(pg_) + "::" + what + "() before any scale(): scale the loss with scaler.scale(loss) "
                     "and call backward() on that, earlier in the iteration");
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled()) return outputs;
  if (!scale_.defined()) {
    const auto on = torch::TensorOptions().device(outputs.device());
    scale_ = torch::full({1}, options_.init_scale(), on.dtype(torch::kFloat));
    growth_tracker_ = torch::full({1}, init_growth_tracker_, on.dtype(torch::kInt));
  }
  return outputs * scale_.to(outputs.device());
}

std::vector<torch::Tensor> GradScaler::scale(const std::vector<torch::Tensor>& outputs) {
  std::vector<torch::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& t : outputs) scaled.push_back(scale(t));
  return scaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  check_started("unscale_");
  auto& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled)
    throw UsageError(who(pg_) + "::unscale_() has already been called on this optimizer since the last update()");
  if (state.stage == Stage::kStepped)
    throw UsageError(who(pg_) + "::unscale_() is being called after step(); call it before step(), once per update()");

  // The reciprocal in float64, as PyTorch (float32 division can be inexact on some builds).
  const auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  torch::NoGradGuard no_grad;
  // Refused before any gradient is touched, as PyTorch.
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined() && p.grad().scalar_type() == torch::kHalf)
        throw UsageError(who(pg_) + ": attempting to unscale float16 gradients: keep the parameters float32 "
                         "(autocast casts them for the operations that need it) so their gradients are float32");
  // One call per device and dtype; a found-inf flag and a reciprocal per device.
  std::map<std::pair<std::string, at::ScalarType>, std::vector<torch::Tensor>> groups;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> per_device;  // found_inf, inv_scale
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto& grad = p.mutable_grad();
      if (!grad.defined()) continue;
      const auto values = grad.is_sparse() ? grad._values() : grad;
      const std::string device = values.device().str();
      if (!per_device.count(device))
        per_device[device] = {torch::zeros({1}, values.options().dtype(torch::kFloat)), inv_scale.to(values.device())};
      groups[{device, values.scalar_type()}].push_back(values);
    }
  }
  for (auto& [key, grads] : groups) check_and_unscale(grads, per_device[key.first].first, per_device[key.first].second);
  auto found_inf = torch::zeros({1}, scale_.options().dtype(torch::kFloat));
  for (auto& [device, flags] : per_device) found_inf.add_(flags.first.to(found_inf.device()));
  // Every rank decides on the same flag: the steps skipped, and so the
  // parameters and the scale, stay the same on every rank.
  const auto pg = pg_ ? pg_ : (is_initialized() ? default_process_group() : nullptr);
  if (pg && pg->size() > 1) {
    auto flag = found_inf.to(pg->device());
    pg->allreduce(flag).wait();
    found_inf.copy_(flag);
  }
  state.found_inf = found_inf;
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  check_started("step");
  if (per_optimizer_[&optimizer].stage == Stage::kStepped)
    throw UsageError(who(pg_) + "::step() has already been called since the last update()");
  if (per_optimizer_[&optimizer].stage == Stage::kReady) unscale_(optimizer);
  auto& state = per_optimizer_[&optimizer];
  const bool skip = state.found_inf.item<float>() != 0.0f;
  if (!skip) optimizer.step();
  state.stage = Stage::kStepped;
  return !skip;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  check_started("update");
  torch::Tensor found_inf;
  for (auto& [optimizer, state] : per_optimizer_) {
    if (!state.found_inf.defined()) continue;
    found_inf = found_inf.defined() ? found_inf + state.found_inf : state.found_inf.clone();
  }
  if (!found_inf.defined())
    throw UsageError(who(pg_) + "::update(): no inf checks were recorded since the last update(); call "
                     "step(optimizer) (or unscale_(optimizer)) first");
#ifdef DDP_WITH_CUDA
  if (scale_.is_cuda()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf, options_.growth_factor(), options_.backoff_factor(),
                           options_.growth_interval());
    per_optimizer_.clear();
    return;
  }
#endif
  // _amp_update_scale_'s arithmetic: the product in float64, stored as float32.
  float scale = scale_.item<float>();
  int64_t tracker = growth_tracker_.item<int32_t>();
  if (found_inf.item<float>() != 0.0f) {
    scale = static_cast<float>(static_cast<double>(scale) * options_.backoff_factor());
    tracker = 0;
  } else if (tracker + 1 == options_.growth_interval()) {
    const auto grown = static_cast<float>(static_cast<double>(scale) * options_.growth_factor());
    if (std::isfinite(grown)) scale = grown;  // never past float32's range
    tracker = 0;
  } else {
    ++tracker;
  }
  scale_.fill_(scale);
  growth_tracker_.fill_(tracker);
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  check_started("update");
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : options_.init_scale();
}

int64_t GradScaler::get_growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : init_growth_tracker_;
}

void GradScaler::set_growth_factor(double factor) {
  auto o = options_;
  check_options(o.growth_factor(factor), who(pg_));
  options_ = o;
}

void GradScaler::set_backoff_factor(double factor) {
  auto o = options_;
  check_options(o.backoff_factor(factor), who(pg_));
  options_ = o;
}

void GradScaler::set_growth_interval(int64_t interval) {
  auto o = options_;
  check_options(o.growth_interval(interval), who(pg_));
  options_ = o;
}

std::optional<GradScalerState> GradScaler::state_dict() const {
  if (!options_.enabled()) return std::nullopt;
  return GradScalerState{get_scale(), options_.growth_factor(), options_.backoff_factor(), options_.growth_interval(),
                         get_growth_tracker()};
}

void GradScaler::load_state_dict(const std::optional<GradScalerState>& state) {
  if (!options_.enabled()) return;
  if (!state)
    throw UsageError(who(pg_) + ": the state to load is empty, possibly because it was saved from a disabled "
                     "GradScaler (a run without float16 mixed precision)");
  // A scale that backed off to 0 (a run whose every step overflowed) is a
  // state PyTorch saves and loads too; only a negative or non-finite one is wrong.
  if (!(state->scale >= 0) || !std::isfinite(state->scale))
    throw UsageError(who(pg_) + ": the scale to load must be a finite number >= 0, not " + std::to_string(state->scale));
  auto o = options_;
  o.growth_factor(state->growth_factor).backoff_factor(state->backoff_factor).growth_interval(state->growth_interval);
  check_options(o, who(pg_));
  o.init_scale(state->scale);
  if (state->growth_tracker < 0 || state->growth_tracker > INT32_MAX)
    throw UsageError(who(pg_) + ": growth tracker " + std::to_string(state->growth_tracker) + " is out of range");
  options_ = o;
  init_growth_tracker_ = state->growth_tracker;
  if (scale_.defined()) scale_.fill_(state->scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(state->growth_tracker);
}

namespace detail {

void unscale_before_vote(GradScaler& scaler, torch::optim::Optimizer& optimizer) {
  if (!scaler.options_.enabled()) return;
  const auto it = scaler.per_optimizer_.find(&optimizer);
  if (it == scaler.per_optimizer_.end() || it->second.stage == GradScaler::Stage::kReady) scaler.unscale_(optimizer);
}

void forget_unscale(GradScaler& scaler, torch::optim::Optimizer& optimizer) { scaler.per_optimizer_.erase(&optimizer); }

}  // namespace detail

}  // namespace ddp
