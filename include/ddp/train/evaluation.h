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
  torch::NoGradGuard no_grad;
  const bool was_training = net->is_training();
  net->eval();
  MetricSums sums({"loss", "correct"});
  const auto device = pg.device();
  int64_t batches = 0;
  for (auto& batch : loader) {
    if (max_batches >= 0 && batches++ >= max_batches) break;
    auto x = batch.data.to(device), y = batch.target.to(device);
    auto logits = net->forward(x);
    sums.add("loss", torch::nn::functional::cross_entropy(
                         logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                         .template item<double>());
    sums.add("correct", logits.argmax(1).eq(y).sum().template item<double>());
    sums.add_count(x.size(0));
  }
  net->train(was_training);
  auto total = sums.all_reduced(pg);
  ClassifierResult r;
  r.loss_sum = total.sum("loss");
  r.correct = static_cast<int64_t>(total.sum("correct") + 0.5);
  r.count = total.count();
  return r;
}

}  // namespace ddp
