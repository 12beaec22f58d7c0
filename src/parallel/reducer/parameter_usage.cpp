// Which parameters got a gradient (parameter_usage.h).
#include "parallel/reducer/parameter_usage.h"

#include <torch/torch.h>

#include <unordered_set>

#include "usage_check.h"

namespace ddp::detail {

ParameterUsage::ParameterUsage(size_t num_params, const DDPOptions& options)
    : dynamic_(options.find_unused_parameters() && !options.static_graph()),
      static_graph_(options.static_graph()),
      locally_used_(num_params, 0),
      hook_counts_(num_params, 0) {}

void ParameterUsage::prepare_backward(const std::vector<at::Tensor>& outputs,
                                      const std::vector<AccumulatorPtr>& accumulators) {
  hooks_left_ = hook_counts_;
  if (!dynamic_) return;
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  unused_from_graph_.clear();
  if (outputs.empty()) return;
  for (size_t i = 0; i < accumulators.size(); ++i)
    if (!seen.count(accumulators[i].get())) unused_from_graph_.push_back(i);
}

bool ParameterUsage::last_hook(size_t i, const std::string& who, const std::string& name) {
  check_usage(hooks_left_[i] > 0, who, "parameter '", name, "' received ",
              hook_counts_[i] == 0 ? "a gradient, but it received none"
                                   : "more gradients than the " + std::to_string(hook_counts_[i]),
              " in the first iteration. The training graph changed, which static_graph(true) does not allow; "
              "construct DistributedDataParallel without static_graph (with find_unused_parameters(true) if "
              "some parameters go unused in some iterations).");
  return --hooks_left_[i] == 0;
}

void ParameterUsage::end_first_iteration() {
  static_unused_.clear();
  for (size_t i = 0; i < hook_counts_.size(); ++i)
    if (hook_counts_[i] == 0) static_unused_.push_back(i);
}

void ParameterUsage::launch_used_map(ProcessGroup& pg) {
  if (pg.size() == 1 || used_work_.valid()) return;
  used_map_ = torch::from_blob(locally_used_.data(), {static_cast<int64_t>(locally_used_.size())}, torch::kInt8)
                  .to(torch::TensorOptions().dtype(torch::kInt32).device(pg.device()));
  used_work_ = pg.allreduce(used_map_);
}

void ParameterUsage::read_used_map() {
  used_anywhere_ = nullptr;
  used_cpu_ = at::Tensor();
  if (used_map_.defined() && used_work_.valid()) {
    used_cpu_ = used_map_.cpu();
    used_anywhere_ = used_cpu_.data_ptr<int32_t>();
  }
  if (static_first_iteration()) {
    used_globally_.assign(locally_used_.size(), 1);
    for (size_t i = 0; i < locally_used_.size(); ++i) used_globally_[i] = used_anywhere(i);
  }
}

bool ParameterUsage::reduced_gradient_applies(size_t i) const {
  if (static_graph_ && !used_globally_[i]) return false;
  if (dynamic_ && !used_anywhere(i)) return false;
  return true;
}

void ParameterUsage::end_step() {
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  used_anywhere_ = nullptr;
  used_cpu_ = at::Tensor();
}

void ParameterUsage::reset_iteration() {
  used_work_ = Work();
  unused_from_graph_.clear();
}

void ParameterUsage::shadow_first_iteration_map(ProcessGroup& pg) {
  if (!static_first_iteration() || pg.size() == 1) return;
  auto zeros = torch::zeros({static_cast<int64_t>(locally_used_.size())},
                            torch::TensorOptions().dtype(torch::kInt32).device(pg.device()));
  pg.allreduce(zeros).wait();
}

void ParameterUsage::shadow_used_map(ProcessGroup& pg) {
  if (!dynamic_ || pg.size() == 1) return;
  if (!used_map_.defined())
    used_map_ = torch::zeros({static_cast<int64_t>(locally_used_.size())},
                             torch::TensorOptions().dtype(torch::kInt32).device(pg.device()));
  pg.allreduce(used_map_).wait();
}

}  // namespace ddp::detail
