// Post-local SGD as an optimizer, PyTorch's
// torch.distributed.optim.PostLocalSGDOptimizer: wraps any LibTorch
// optimizer, and each step() steps it, then lets a model averager
// (ddp/optim/model_averaging.h) average its parameters over the ranks.
// Pair it with post_localSGD_hook (ddp/parallel/post_local_sgd_hook.h),
// whose start_localSGD_iter equals the averager's warmup_steps.
//
//   auto averager = std::make_shared<ddp::PeriodicModelAverager>(/*period=*/4, /*warmup_steps=*/100);
//   ddp::PostLocalSGDOptimizer opt(std::make_shared<torch::optim::SGD>(net->parameters(), 0.01), averager);
//   for (...) { opt.zero_grad(); loss(model(x), y).backward(); opt.step(); }
//   torch::save(opt, "optimizer.pt");  // the wrapped optimizer's state and the averager's "step"
//
// It is a torch::optim::Optimizer: zero_grad(), param_groups() (and LR
// schedulers through them) and save()/load() work where one is expected.
// Its param_groups() hold the wrapped optimizer's parameters; their options
// are handed to the wrapped optimizer at each step, as are groups added
// with add_param_group(). Its state() is empty: the state is optim().state().
#pragma once

#include <torch/torch.h>

#include <memory>

#include "ddp/optim/model_averaging.h"

namespace ddp {

class PostLocalSGDOptimizer : public torch::optim::Optimizer {
 public:
  // Neither may be null (a UsageError).
  PostLocalSGDOptimizer(std::shared_ptr<torch::optim::Optimizer> optim, std::shared_ptr<ModelAverager> averager);

  // optim.step(closure), then averager.average_parameters(param_groups()):
  // collective whenever the averager averages. Returns the closure's loss.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // PyTorch's state_dict() with the averager's step added: the wrapped
  // optimizer's archive plus an int "step".
  void save(torch::serialize::OutputArchive& archive) const override;
  // PyTorch's load_state_dict(): loads the wrapped optimizer, then the
  // averager's step from "step"; an archive without one (the wrapped
  // optimizer's own) warns "Loaded state dict does not contain a step
  // counter for an averager. Setting step counter to 0." and sets 0.
  void load(torch::serialize::InputArchive& archive) override;

  torch::optim::Optimizer& optim() { return *optim_; }
  const torch::optim::Optimizer& optim() const { return *optim_; }
  ModelAverager& averager() { return *averager_; }
  const ModelAverager& averager() const { return *averager_; }

 private:
  void options_to_optim();
  void options_from_optim();

  std::shared_ptr<torch::optim::Optimizer> optim_;
  std::shared_ptr<ModelAverager> averager_;
};

}  // namespace ddp
