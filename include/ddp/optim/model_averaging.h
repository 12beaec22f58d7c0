// Model averaging for post-local SGD: PyTorch's
// torch.distributed.algorithms.model_averaging (averagers,
// hierarchical_model_averager, utils), with the same names, rules and
// arithmetic. After the optimizer's step, an averager replaces each
// parameter by its mean over a group of ranks, every `period` steps once
// `warmup_steps` have passed; post_localSGD_hook (ddp/parallel/) averages
// only the gradients of a subgroup, or none, in between.
//
//   ddp::PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/100);
//   for (...) { opt.zero_grad(); loss.backward(); opt.step(); averager.average_parameters(net->parameters()); }
//
// The parameters may be a model's or an optimizer's groups; only those with
// a gradient are averaged. Groups are dist::Group (ddp/comm/dist.h): the
// default group when omitted, a ProcessGroup, or what new_group returned.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ddp/comm/dist.h"

namespace ddp {

// The parameters that have a gradient, in order (PyTorch's
// get_params_to_average): of a list, or of an optimizer's groups.
std::vector<at::Tensor> get_params_to_average(const std::vector<at::Tensor>& params);
std::vector<at::Tensor> get_params_to_average(const std::vector<torch::optim::OptimizerParamGroup>& param_groups);

// Collective over `group`: every parameter becomes the mean of its values
// over the group's ranks. As PyTorch: the parameters are flattened into one
// buffer, divided by the group's size, all-reduced (sum), and each
// parameter's data becomes its slice of that buffer (a view of it, in the
// parameter's dtype). Nothing on a rank outside the group; nothing for an
// empty list (PyTorch's torch.cat refuses one).
void average_parameters(const std::vector<at::Tensor>& params, const dist::Group& group = {});

// What averages the parameters after each step, as PyTorch's ModelAverager.
class ModelAverager {
 public:
  virtual ~ModelAverager() = default;

  // Averages the parameters that have a gradient, if this step is one to
  // average at, over the group for it; then counts the step. Collective
  // over that group whenever it averages. Every rank must call it at the
  // same steps.
  void average_parameters(const std::vector<at::Tensor>& params);
  void average_parameters(const std::vector<torch::optim::OptimizerParamGroup>& param_groups);

  // The whole group averaged over.
  const dist::Group& process_group() const { return process_group_; }

  // Calls of average_parameters so far (PyTorch's averager.step): what a
  // checkpoint keeps (PostLocalSGDOptimizer's "step").
  int64_t step = 0;

 protected:
  explicit ModelAverager(dist::Group process_group) : process_group_(std::move(process_group)) {}
  // The group to average over at `step`, or none.
  virtual std::optional<dist::Group> group_at_step() const = 0;

 private:
  void average_if_due(const std::vector<at::Tensor>& params);
  dist::Group process_group_;
};

// Averages over the whole group every `period` steps from `warmup_steps` on
// (at warmup_steps, warmup_steps + period, ...), as PyTorch's
// PeriodicModelAverager. period < 1 or warmup_steps < 0 is a UsageError;
// period 1 warns (DDP alone averages as much, more cheaply).
class PeriodicModelAverager : public ModelAverager {
 public:
  explicit PeriodicModelAverager(int64_t period, int64_t warmup_steps = 0, dist::Group process_group = {});
  int64_t period() const { return period_; }
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  std::optional<dist::Group> group_at_step() const override;
  int64_t period_;
  int64_t warmup_steps_;
};

// Hierarchical SGD, as PyTorch's HierarchicalModelAverager: for each
// (period, group size) of `period_group_size_dict`, in order, the group's
// ranks are cut into subgroups of that size (dist::new_subgroups, made here
// by every rank: collective), which average every `period` steps; at a
// step several periods divide, only the largest period's groups average.
// The last group size must be the whole group's. After warmup_steps.
//   HierarchicalModelAverager({{4, 8}, {16, 16}}, 100)  // OrderedDict([(4, 8), (16, 16)])
// UsageError, before any group is made, for: no entry, a period below 1,
// periods not increasing (PyTorch assumes they do), a group size that is
// not positive or does not divide the whole group's, a last size that is
// not the whole group's, warmup_steps < 0. A largest period of 1 warns.
class HierarchicalModelAverager : public ModelAverager {
 public:
  explicit HierarchicalModelAverager(std::vector<std::pair<int64_t, int>> period_group_size_dict,
                                     int64_t warmup_steps = 0, dist::Group process_group = {});
  int64_t warmup_steps() const { return warmup_steps_; }
  // Each period with this rank's group for it, in order.
  const std::vector<std::pair<int64_t, dist::Group>>& period_process_group_dict() const { return groups_; }

 private:
  std::optional<dist::Group> group_at_step() const override;
  std::vector<std::pair<int64_t, dist::Group>> groups_;
  int64_t warmup_steps_;
};

}  // namespace ddp
