// Which parameters got a gradient, for the two ways DDP lets some go unused
// (PyTorch 1.13's rules):
//   find_unused_parameters (dynamic): each forward's graph is searched for
//     the parameters it cannot reach; which ones any rank used is
//     all-reduced after the last bucket (the used map);
//   static_graph: the first synchronised iteration counts each parameter's
//     hooks and reduces after backward; later ones mark a parameter ready at
//     its last hook, and the parameters no hook reached then at the first hook.
// Owns every per-parameter usage vector and the used map's collective; the
// reducer asks it at named points of a step.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/parallel/ddp_options.h"

namespace ddp::detail {

// A parameter's gradient accumulator, held as the LibTorch in use hands it
// out: std::shared_ptr<Node> up to 2.14, c10::intrusive_ptr<Node> from 2.15.
using AccumulatorPtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

class ParameterUsage {
 public:
  ParameterUsage(size_t num_params, const DDPOptions& options);

  bool dynamic() const { return dynamic_; }  // find_unused_parameters without static_graph
  // A forward that prepares a synchronised backward (or a joined rank's
  // shadow of one): a static graph's first iteration is the first of them.
  void count_synchronised_forward() { ++sync_forwards_; }
  bool static_first_iteration() const { return static_graph_ && sync_forwards_ == 1; }
  bool static_after_first_iteration() const { return static_graph_ && sync_forwards_ > 1; }

  // ---- before backward
  // Static, later iterations: every parameter's hooks to come. Dynamic: the
  // parameters whose gradient accumulators `outputs` cannot reach (none when
  // there are no outputs: the end of backward will tell).
  void prepare_backward(const std::vector<at::Tensor>& outputs, const std::vector<AccumulatorPtr>& accumulators);

  // ---- a hook fires
  // Every hook, no_sync backwards included (as PyTorch), so that a parameter
  // used only while accumulating is reduced at the synchronised step.
  void note_hook(size_t i, bool has_grad) {
    if (dynamic_ && has_grad) locally_used_[i] = 1;
  }
  // Static, first iteration: only counted.
  void count_first_iteration_hook(size_t i, bool has_grad) {
    if (has_grad) locally_used_[i] = 1;
    ++hook_counts_[i];
  }
  // Static, later iterations: whether this is parameter i's last hook of the
  // backward. More hooks than in the first iteration are a usage error.
  bool last_hook(size_t i, const std::string& who, const std::string& name);
  // Known unused before any gradient (dynamic: found in the graph; static:
  // no hook in the first iteration): marked ready at the first hook.
  const std::vector<size_t>& unused() const { return static_graph_ ? static_unused_ : unused_from_graph_; }

  // ---- the end of backward
  // Static, first iteration: the parameters no hook reached are this rank's
  // unused ones from now on.
  void end_first_iteration();
  // All-reduces which parameters this rank used (after the last bucket;
  // once per iteration; none on one rank).
  void launch_used_map(ProcessGroup& pg);
  void wait_used_map() { used_work_.wait(); }
  // After the wait: which parameters some rank used, and for a static
  // graph's first iteration, the usage kept from then on.
  void read_used_map();
  // Whether the reduced gradient goes to parameter i: a parameter no rank
  // used keeps its gradient untouched (undefined stays undefined, so
  // optimizers skip it), as PyTorch; a static graph's usage is the first
  // iteration's.
  bool reduced_gradient_applies(size_t i) const;
  // The step is over: local usage starts again.
  void end_step();
  // The iteration was abandoned or finished: no used map in flight.
  void reset_iteration();

  // ---- ddp::Join: a joined rank's usage collectives, in the others' order
  // A static graph's first iteration: zeros for the used map, first.
  void shadow_first_iteration_map(ProcessGroup& pg);
  // Dynamic: the last map it reduced (zeros if none), after the buckets.
  void shadow_used_map(ProcessGroup& pg);

 private:
  bool used_anywhere(size_t i) const { return locally_used_[i] || (used_anywhere_ ? used_anywhere_[i] > 0 : false); }

  const bool dynamic_, static_graph_;
  int64_t sync_forwards_ = 0;
  std::vector<char> locally_used_;  // got a gradient since the last synchronised backward, no_sync ones included
  std::vector<size_t> unused_from_graph_;
  at::Tensor used_map_;  // locally_used_, all-reduced
  Work used_work_;
  at::Tensor used_cpu_;
  const int32_t* used_anywhere_ = nullptr;  // into used_cpu_, after read_used_map(); null: no map
  std::vector<int> hook_counts_;       // hooks per parameter in the first iteration
  std::vector<int> hooks_left_;        // this iteration's, counting down
  std::vector<size_t> static_unused_;  // no hook in the first iteration, on this rank
  std::vector<char> used_globally_;    // got a gradient on some rank in the first iteration
};

}  // namespace ddp::detail
