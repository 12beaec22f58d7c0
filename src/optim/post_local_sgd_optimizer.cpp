#include "ddp/optim/post_local_sgd_optimizer.h"

#include "usage_check.h"

namespace ddp {
namespace {

const torch::optim::Optimizer& checked(const std::shared_ptr<torch::optim::Optimizer>& optim,
                                       const std::shared_ptr<ModelAverager>& averager) {
  check_usage(optim != nullptr, "PostLocalSGDOptimizer: the optimizer to wrap is null");
  check_usage(averager != nullptr, "PostLocalSGDOptimizer: the model averager is null");
  return *optim;
}

std::vector<torch::optim::OptimizerParamGroup> copies(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (const auto& g : groups) out.emplace_back(g.params(), g.options().clone());
  return out;
}

}  // namespace

PostLocalSGDOptimizer::PostLocalSGDOptimizer(std::shared_ptr<torch::optim::Optimizer> optim,
                                             std::shared_ptr<ModelAverager> averager)
    // Both arguments check: either may be evaluated first.
    : Optimizer(copies(checked(optim, averager).param_groups()), checked(optim, averager).defaults().clone()),
      optim_(std::move(optim)),
      averager_(std::move(averager)) {}

// Python's wrapper shares the wrapped optimizer's list of groups; LibTorch's
// base class owns its own, so they are handed over: options (a scheduler
// changes ours) and groups added to the wrapper before a step, options back
// after a load.
void PostLocalSGDOptimizer::options_to_optim() {
  auto& theirs = optim_->param_groups();
  for (size_t g = theirs.size(); g < param_groups_.size(); ++g) optim_->add_param_group(param_groups_[g]);
  for (size_t g = 0; g < param_groups_.size(); ++g) theirs[g].set_options(param_groups_[g].options().clone());
}

void PostLocalSGDOptimizer::options_from_optim() {
  const auto& theirs = optim_->param_groups();
  for (size_t g = 0; g < param_groups_.size() && g < theirs.size(); ++g)
    param_groups_[g].set_options(theirs[g].options().clone());
}

torch::Tensor PostLocalSGDOptimizer::step(LossClosure closure) {
  options_to_optim();
  torch::Tensor loss = optim_->step(std::move(closure));
  averager_->average_parameters(optim_->param_groups());
  return loss;
}

void PostLocalSGDOptimizer::save(torch::serialize::OutputArchive& archive) const {
  optim_->save(archive);
  archive.write("step", c10::IValue(averager_->step));
}

void PostLocalSGDOptimizer::load(torch::serialize::InputArchive& archive) {
  optim_->load(archive);
  options_from_optim();
  c10::IValue step;
  if (archive.try_read("step", step)) {
    check_usage(step.isInt(), "PostLocalSGDOptimizer::load: the archive's \"step\" is a ", step.tagKind(),
                ", not the averager's step counter (an int)");
    averager_->step = step.toInt();
  } else {
    TORCH_WARN("Loaded state dict does not contain a step counter for an averager. Setting step counter to 0.");
    averager_->step = 0;
  }
}

}  // namespace ddp
