// Evaluation across ranks: each rank evaluates its own shard (a
// DistributedSampler with pad(false), so no sample is counted twice), sums
// what it measured, and one all-reduce of those sums gives every rank the
// result single-process evaluation would give.
//
// Evaluation runs the plain module (not the DistributedDataParallel wrapper)
// under NoGradGuard: the wrapper does no collective there, so ranks with
// different shard sizes never wait on each other until the final all-reduce.
//
//   auto result = ddp::evaluate_classifier(net, *test_loader, *pg);
//   result.loss();      // mean cross-entropy over the whole test set
//   result.accuracy();
//
// Any other model (a language model, a regression) names its own sums and
// says what one batch adds to them; ddp::evaluate runs the loop:
//
//   auto val = ddp::evaluate(net, *val_loader, *pg, {"loss"}, [&](torch::data::Example<>& b, ddp::MetricSums& sums) {
//     auto logits = net->forward(b.data);                    // [N, T, vocab]
//     sums.add("loss", cross_entropy(logits.flatten(0, 1), b.target.flatten(), sum).item<double>());
//     sums.add_count(b.target.numel());                      // characters, not sequences
//   });
//   double bits_per_char = val.mean("loss") / std::log(2.0);  // the whole set's, on every rank
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

// Named sums plus a sample count, reduced across ranks in one all-reduce.
// Every rank must declare the same names in the same order.
class MetricSums {
 public:
  explicit MetricSums(std::vector<std::string> names);

  // Adds to the named sum; throws UsageError for an undeclared name.
  void add(const std::string& name, double value);
  void add_count(int64_t samples) { count_ += samples; }

  double sum(const std::string& name) const;
  // sum / count (0 when nothing was counted).
  double mean(const std::string& name) const;
  int64_t count() const { return count_; }
  const std::vector<std::string>& names() const { return names_; }

  // The sums over every rank (float64, one all-reduce); collective.
  MetricSums all_reduced(ProcessGroup& pg) const;

 private:
  size_t index(const std::string& name) const;
  std::vector<std::string> names_;
  std::vector<double> sums_;
  int64_t count_ = 0;
};

// Puts `net` (a module holder, a shared_ptr, or anything with ->is_training(),
// ->eval() and ->train(bool)) in eval mode under NoGradGuard, and back in
// its previous mode when it goes (also when an exception leaves the loop).
template <typename Net>
class EvalModeGuard {
 public:
  explicit EvalModeGuard(Net& net) : net_(net), was_training_(net->is_training()) { net_->eval(); }
  ~EvalModeGuard() { net_->train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  torch::NoGradGuard no_grad_;
  Net& net_;
  bool was_training_;
};

namespace detail {

// On a recoverable group (ddp/comm/recovery.h), after what the ranks just
// ran (`what`: "the evaluation"): whether they must run it again, the group
// re-formed, because a rank did not finish it (the group's vote), or,
// inside a catch (in_catch), because the error was a peer's fault. False on
// any other group; inside a catch, false means: rethrow. Where too few ranks
// remain: a checkpoint, then ddp::Preempted (src/train/recovery_glue.h).
bool run_again(ProcessGroup& pg, const char* what, bool in_catch);

// fn() (a collective; not void) once every rank finished it: on a
// recoverable group, a rank lost while it ran makes the others re-form and
// run it again on the new group; on any other group, fn() once.
template <typename F>
auto until_agreed(ProcessGroup& pg, const char* what, F&& fn) -> decltype(fn()) {
  for (;;) {
    try {
      auto result = fn();
      if (!run_again(pg, what, false)) return result;
    } catch (const std::exception&) {
      if (!run_again(pg, what, true)) throw;
    }
  }
}

}  // namespace detail

// The evaluation loop for any model: `net` (as EvalModeGuard takes it) in
// eval mode under NoGradGuard, measure(batch, sums) for each batch of
// `loader` (at most max_batches; < 0: all), then the sums of every rank in
// one all-reduce (float64, SUM). Every rank gets the whole set's sums, count
// and means, as one process evaluating all of it would; with a pad(false)
// sampler no sample is counted twice. Collective: every rank calls it with
// the same names, whatever the size of its shard (an empty one too).
// Under in-process recovery (ddp/comm/recovery.h) a rank lost during the
// evaluation makes the others re-form and evaluate again, each its share of
// the new group (a DistributedSampler made on the group follows it).
template <typename Net, typename Loader, typename Measure>
MetricSums evaluate(Net& net, Loader& loader, ProcessGroup& pg, std::vector<std::string> names, Measure&& measure,
                    int64_t max_batches = -1) {
  return detail::until_agreed(pg, "the evaluation", [&] {
    MetricSums sums(names);
    {
      EvalModeGuard<Net> eval(net);
      int64_t batches = 0;
      for (auto& batch : loader) {
        if (max_batches >= 0 && batches++ >= max_batches) break;
        measure(batch, sums);
      }
    }
    return sums.all_reduced(pg);
  });
}

struct ClassifierResult {
  double loss_sum = 0;   // summed cross-entropy
  int64_t correct = 0;
  int64_t count = 0;
  double loss() const { return count ? loss_sum / static_cast<double>(count) : 0.0; }
  double accuracy() const { return count ? static_cast<double>(correct) / static_cast<double>(count) : 0.0; }
};

// Cross-entropy and accuracy of `net` (a module holder or shared_ptr whose
// forward maps a batch to logits) over `loader`, summed over all ranks.
// The module is put in eval mode and back in its previous mode after.
// max_batches < 0: all of them. Collective: every rank must call it.
template <typename Net, typename Loader>
ClassifierResult evaluate_classifier(Net& net, Loader& loader, ProcessGroup& pg, int64_t max_batches = -1) {
  const auto device = pg.device();
  auto total = evaluate(net, loader, pg, {"loss", "correct"}, [&](auto& batch, MetricSums& sums) {
    auto x = batch.data.to(device), y = batch.target.to(device);
    auto logits = net->forward(x);
    sums.add("loss", torch::nn::functional::cross_entropy(
                         logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                         .template item<double>());
    sums.add("correct", logits.argmax(1).eq(y).sum().template item<double>());
    sums.add_count(x.size(0));
  }, max_batches);
  ClassifierResult r;
  r.loss_sum = total.sum("loss");
  r.correct = static_cast<int64_t>(total.sum("correct") + 0.5);
  r.count = total.count();
  return r;
}

}  // namespace ddp
