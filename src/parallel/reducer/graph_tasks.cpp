// Which graph task's end finalizes a backward (graph_tasks.h).
#include "parallel/reducer/graph_tasks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

namespace ddp::detail {

void GraphTasks::expect_outputs(const std::vector<at::Tensor>& outputs) {
  output_fns_.clear();
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) output_fns_.insert(t.grad_fn().get());
}

bool GraphTasks::arm_current(const void*& task) {
  task = torch::autograd::get_current_graph_task_exec_info();
  if (armed_.count(task)) return false;
  bool outer = output_fns_.empty();
  if (!outer) {
    if (const auto* nodes = torch::autograd::get_current_graph_task_nodes_in_graph()) {
      for (const auto* fn : output_fns_) outer = outer || nodes->count(const_cast<torch::autograd::Node*>(fn)) > 0;
    } else {
      outer = true;
    }
  }
  armed_[task] = outer;
  return true;
}

GraphTasks::Ended GraphTasks::end(const void* task) {
  auto it = armed_.find(task);
  if (it == armed_.end()) return {};
  Ended ended{true, it->second, false};
  armed_.erase(it);
  ended.none_left = armed_.empty();
  return ended;
}

}  // namespace ddp::detail
