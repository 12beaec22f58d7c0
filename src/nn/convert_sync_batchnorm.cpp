// ddp::convert_sync_batchnorm (ddp/nn/sync_batch_norm.h): swaps a model's
// torch::nn::BatchNorm layers for SyncBatchNorm ones on the same tensors.
//
// LibTorch calls a layer through whatever holds it: the module registry
// (children), a Sequential's AnyModule entries, a ModuleList's or
// ModuleDict's entries, or a typed member of the parent, whose forward is
// not virtual. The first four are replaced here; the last cannot be, so a
// layer held by anything but them is refused before anything changes.
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "ddp/nn/sync_batch_norm.h"
#include "usage_check.h"

namespace ddp {

namespace detail {

struct BatchNormConversion {
  template <typename Impl>
  static std::shared_ptr<SyncBatchNormImpl> from(const Impl& bn, const std::shared_ptr<ProcessGroup>& pg) {
    const auto& o = bn.options;
    auto options = SyncBatchNormOptions(o.num_features())
                       .eps(o.eps())
                       .momentum(o.momentum())
                       .affine(o.affine())
                       .track_running_stats(o.track_running_stats());
    SyncBatchNormImpl::Adopted adopted{bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked};
    std::shared_ptr<SyncBatchNormImpl> sync(new SyncBatchNormImpl(options, pg, std::move(adopted)));
    sync->train(bn.is_training());
    return sync;
  }

  // The SyncBatchNorm for `m`, or null when `m` is not a BatchNorm.
  static std::shared_ptr<SyncBatchNormImpl> from_any(const torch::nn::Module& m, const std::shared_ptr<ProcessGroup>& pg) {
    if (const auto* bn = m.as<torch::nn::BatchNorm1d>()) return from(*bn, pg);
    if (const auto* bn = m.as<torch::nn::BatchNorm2d>()) return from(*bn, pg);
    if (const auto* bn = m.as<torch::nn::BatchNorm3d>()) return from(*bn, pg);
    return nullptr;
  }
};

}  // namespace detail

namespace {

using torch::nn::Module;

bool is_batch_norm(const Module& m) {
  return m.as<torch::nn::BatchNorm1d>() || m.as<torch::nn::BatchNorm2d>() || m.as<torch::nn::BatchNorm3d>();
}

std::string type_name(const Module& m) {
  if (m.as<torch::nn::BatchNorm1d>()) return "torch::nn::BatchNorm1d";
  if (m.as<torch::nn::BatchNorm2d>()) return "torch::nn::BatchNorm2d";
  return "torch::nn::BatchNorm3d";
}

// Calls `fn(slot)` for each shared_ptr<Module> slot of a container's own
// storage (beside the registry), with a setter for the slot.
template <typename Fn>
void for_each_container_slot(Module& m, Fn&& fn) {
  if (auto* seq = m.as<torch::nn::Sequential>()) {
    for (auto& any : *seq) fn(any.ptr(), [&any](const std::shared_ptr<SyncBatchNormImpl>& s) { any = torch::nn::AnyModule(s); });
  } else if (auto* list = m.as<torch::nn::ModuleList>()) {
    for (auto& entry : *list) fn(entry, [&entry](const std::shared_ptr<SyncBatchNormImpl>& s) { entry = s; });
  } else if (auto* dict = m.as<torch::nn::ModuleDict>()) {
    for (auto& item : *dict)
      fn(item.value(), [&item](const std::shared_ptr<SyncBatchNormImpl>& s) { item.value() = s; });
  }
}

// Every BatchNorm below `root`, with how many references the registry and
// the containers hold to it and the first path it was found at.
struct Census {
  struct Entry {
    long expected = 0;
    std::string path;
  };
  std::map<Module*, Entry> batch_norms;
  std::vector<Module*> visited;

  void walk(Module& m, const std::string& prefix) {
    if (std::find(visited.begin(), visited.end(), &m) != visited.end()) return;
    visited.push_back(&m);
    for (const auto& item : m.named_children()) {
      const std::string path = prefix.empty() ? item.key() : prefix + "." + item.key();
      Module& child = *item.value();
      if (is_batch_norm(child)) {
        auto& e = batch_norms[&child];
        if (e.path.empty()) e.path = path;
        ++e.expected;
      } else {
        walk(child, path);
      }
    }
    for_each_container_slot(m, [this](const std::shared_ptr<Module>& slot, auto&&) {
      if (slot && is_batch_norm(*slot)) ++batch_norms[slot.get()].expected;
    });
  }
};

void replace(Module& m, const std::shared_ptr<ProcessGroup>& pg, std::map<Module*, std::shared_ptr<SyncBatchNormImpl>>& made,
             std::vector<Module*>& visited) {
  if (std::find(visited.begin(), visited.end(), &m) != visited.end()) return;
  visited.push_back(&m);
  // One SyncBatchNorm per BatchNorm, however many places hold it.
  auto sync_for = [&](Module& bn) {
    auto& s = made[&bn];
    if (!s) s = detail::BatchNormConversion::from_any(bn, pg);
    return s;
  };
  for (const auto& item : m.named_children()) {
    if (is_batch_norm(*item.value()))
      m.replace_module(item.key(), sync_for(*item.value()));
    else
      replace(*item.value(), pg, made, visited);
  }
  for_each_container_slot(m, [&](const std::shared_ptr<Module>& slot, auto&& set) {
    if (slot && is_batch_norm(*slot)) set(sync_for(*slot));
  });
}

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          std::shared_ptr<ProcessGroup> process_group) {
  if (!process_group) process_group = default_process_group();  // UsageError when there is none
  check_usage(module != nullptr, rank_tag(*process_group), ": convert_sync_batchnorm: the module is null");
  if (auto sync = detail::BatchNormConversion::from_any(*module, process_group)) return sync;

  // First make sure every replacement will take effect; only then change.
  Census census;
  census.walk(*module, "");
  for (auto& [bn, entry] : census.batch_norms) {
    // The registry's and the containers' references, and ours just below.
    const long held = bn->shared_from_this().use_count() - 1;
    check_usage(held <= entry.expected, rank_tag(*process_group), ": convert_sync_batchnorm: '", entry.path, "' (",
                type_name(*bn), ") is also held outside the module registry and its containers (",
                held - entry.expected,
                " more reference(s)): most likely a typed member of its parent (e.g. `torch::nn::BatchNorm2d bn1;`), "
                "whose forward is not virtual and would keep calling the unsynchronised layer, or a variable of "
                "your own. Build that layer as ddp::SyncBatchNorm, or hold it in a torch::nn::Sequential and call it "
                "through that, and keep other references to it only after converting. Nothing was converted.");
  }
  std::map<Module*, std::shared_ptr<SyncBatchNormImpl>> made;
  std::vector<Module*> visited;
  replace(*module, process_group, made, visited);
  return module;
}

}  // namespace ddp
