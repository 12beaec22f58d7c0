// When a backward has ended, for the reducer. A backward is one autograd
// graph task, but a reentrant backward inside it (activation checkpointing
// runs one per checkpointed segment) is a graph task of its own and ends
// first. The reducer queues a callback on every graph task that fires one of
// its hooks, once each; this remembers which tasks it armed and whether each
// is the backward through the forward's output, so that only that outer one,
// or one that finds every gradient ready, finalizes.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include <map>
#include <unordered_set>
#include <vector>

namespace ddp::detail {

class GraphTasks {
 public:
  // Before a synchronised backward: the forward's outputs, whose backward is
  // the outer one (none known: every task counts as outer).
  void expect_outputs(const std::vector<at::Tensor>& outputs);
  // From a hook, inside a graph task: whether that task's end is still to
  // be armed (it is then recorded as armed, and `task` says which it is).
  bool arm_current(const void*& task);
  // A task's end-of-task callback ran.
  struct Ended {
    bool armed = false;       // it was one of ours (not cleared since)
    bool outer = false;       // the backward through the forward's output
    bool none_left = false;   // no other armed task is still running
  };
  Ended end(const void* task);
  void clear() { armed_.clear(); }

 private:
  std::map<const void*, bool> armed_;  // task (its exec_info) -> outer
  std::unordered_set<const torch::autograd::Node*> output_fns_;
};

}  // namespace ddp::detail
