#include "ddp/optim/model_averaging.h"

#include <torch/cuda.h>

#include <string>

#include "usage_check.h"

namespace ddp {

std::vector<at::Tensor> get_params_to_average(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params)
    if (p.grad().defined()) out.push_back(p);
  return out;
}

std::vector<at::Tensor> get_params_to_average(const std::vector<torch::optim::OptimizerParamGroup>& param_groups) {
  std::vector<at::Tensor> out;
  for (const auto& group : param_groups)
    for (const auto& p : group.params())
      if (p.grad().defined()) out.push_back(p);
  return out;
}

void average_parameters(const std::vector<at::Tensor>& params, const dist::Group& group) {
  if (!group.is_member() || params.empty()) return;
  std::vector<at::Tensor> flat_views;
  flat_views.reserve(params.size());
  for (const auto& p : params) flat_views.push_back(p.data().reshape({-1}));
  // PyTorch's order: divide first, then sum; the same bits.
  at::Tensor flat = torch::cat(flat_views);
  flat.div_(dist::get_world_size(group));
  if (flat.is_cuda()) torch::cuda::synchronize();
  dist::all_reduce(flat, ReduceOp::SUM, group);
  int64_t offset = 0;
  for (at::Tensor p : params) {
    const int64_t n = p.numel();
    // As PyTorch's `p.data = ...`: the parameter now views the buffer.
    p.set_data(flat.slice(0, offset, offset + n).view_as(p).type_as(p));
    offset += n;
  }
}

// ---- ModelAverager -------------------------------------------------------------

void ModelAverager::average_parameters(const std::vector<at::Tensor>& params) {
  average_if_due(get_params_to_average(params));
}

void ModelAverager::average_parameters(const std::vector<torch::optim::OptimizerParamGroup>& param_groups) {
  average_if_due(get_params_to_average(param_groups));
}

void ModelAverager::average_if_due(const std::vector<at::Tensor>& params) {
  if (const auto group = group_at_step()) ddp::average_parameters(params, *group);
  ++step;
}

namespace {

std::string averager_who(const dist::Group& group, const char* name) {
  return "rank " + std::to_string(group.is_member() ? dist::get_rank(group) : -1) + ": " + name + ": ";
}

const char* const kPeriodOne =
    "no need to use model averaging because the communication cost of all-reducing parameters will be no less "
    "than the cost of all-reducing gradients by DistributedDataParallel in the backward pass. Therefore, only "
    "DistributedDataParallel should be used for this case.";

}  // namespace

// ---- PeriodicModelAverager -------------------------------------------------------

PeriodicModelAverager::PeriodicModelAverager(int64_t period, int64_t warmup_steps, dist::Group process_group)
    : ModelAverager(std::move(process_group)), period_(period), warmup_steps_(warmup_steps) {
  const std::string who = averager_who(this->process_group(), "PeriodicModelAverager");
  check_usage(warmup_steps >= 0, who, "warmup_steps is ", warmup_steps, "; it must not be negative");
  check_usage(period >= 1, who, "period is ", period, "; it must be positive");
  if (period == 1) TORCH_WARN("When period is 1, ", kPeriodOne);
}

std::optional<dist::Group> PeriodicModelAverager::group_at_step() const {
  if (step >= warmup_steps_ && (step - warmup_steps_) % period_ == 0) return process_group();
  return std::nullopt;
}

// ---- HierarchicalModelAverager ---------------------------------------------------

namespace {

// PyTorch's checks and ours (increasing periods, sizes that divide), all
// before the first subgroup is made.
void check_hierarchy(const std::vector<std::pair<int64_t, int>>& levels, int64_t warmup_steps, int overall,
                     const std::string& who) {
  check_usage(!levels.empty(), who, "period_group_size_dict is empty; give at least one (period, group size)");
  for (size_t i = 0; i < levels.size(); ++i) {
    const auto [period, size] = levels[i];
    check_usage(period >= 1, who, "period ", period, " is not positive");
    if (i > 0)  // (check_usage's arguments are all evaluated: levels[i - 1] only here)
      check_usage(period > levels[i - 1].first, who, "period ", period, " follows period ", levels[i - 1].first,
                  ": the periods must increase, each level averaging less often than the one before");
    check_usage(size >= 1 && size <= overall && overall % size == 0, who, "group size ", size, " (period ", period,
                ") must divide the size of process_group, ", overall);
  }
  check_usage(levels.back().second == overall, who, "the last group size, ", levels.back().second,
              ", must be the size of process_group, ", overall, ": the last level averages over all of it");
  check_usage(warmup_steps >= 0, who, "warmup_steps is ", warmup_steps, "; it must not be negative");
}

}  // namespace

HierarchicalModelAverager::HierarchicalModelAverager(std::vector<std::pair<int64_t, int>> period_group_size_dict,
                                                     int64_t warmup_steps, dist::Group process_group)
    : ModelAverager(std::move(process_group)), warmup_steps_(warmup_steps) {
  const int overall = static_cast<int>(this->process_group().ranks().size());
  check_hierarchy(period_group_size_dict, warmup_steps, overall,
                  averager_who(this->process_group(), "HierarchicalModelAverager"));
  if (period_group_size_dict.back().first == 1)
    TORCH_WARN("When the maximum period in arg ``period_group_size_dict`` is 1, ", kPeriodOne);
  for (const auto& [period, size] : period_group_size_dict) {
    if (size == overall) groups_.emplace_back(period, this->process_group());
    else groups_.emplace_back(period, dist::new_subgroups(size, this->process_group()).first);
  }
}

std::optional<dist::Group> HierarchicalModelAverager::group_at_step() const {
  if (step < warmup_steps_) return std::nullopt;
  for (auto it = groups_.rbegin(); it != groups_.rend(); ++it)
    if (step % it->first == 0) return it->second;
  return std::nullopt;
}

}  // namespace ddp
