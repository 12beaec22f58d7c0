// Batch normalisation over the whole job's batch, as PyTorch's
// torch.nn.SyncBatchNorm: in training, each channel's mean and variance are
// those of every rank's samples together (ranks may hold different numbers
// of samples, none included), and backward reduces the two gradient sums the
// input gradient needs. Evaluation uses the running statistics and does no
// communication. Unlike PyTorch 1.13's, it runs on CPUs as well as GPUs.
//
//   auto pg = ddp::init_process_group();
//   auto model = std::make_shared<Net>();      // torch::nn::BatchNorm2d layers in Sequentials
//   ddp::convert_sync_batchnorm(model, pg);    // before DDP, as PyTorch's
//   ddp::DistributedDataParallel<Net> ddp_model(model, pg);
//
// or, in a model of your own, a layer built as one:
//
//   ddp::SyncBatchNorm bn(ddp::SyncBatchNormOptions(64).momentum(0.1), pg);
//
// convert_sync_batchnorm replaces layers where the model's forward reaches
// them through LibTorch's registry: registered children, torch::nn::Sequential,
// ModuleList and ModuleDict entries. BatchNorm's forward is not virtual, so a
// typed member (`torch::nn::BatchNorm2d bn1;`) would keep calling the old
// layer: conversion refuses such a model with a UsageError naming the layer.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "ddp/comm/process_group.h"

namespace ddp {

namespace detail {
struct BatchNormConversion;  // convert_sync_batchnorm's: builds layers on existing tensors
}

// torch::nn::BatchNormOptions' fields and defaults. momentum nullopt: the
// running statistics are a cumulative average (1 / num_batches_tracked).
struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features);
  TORCH_ARG(int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
};

// Parameters and buffers carry torch::nn::BatchNorm's names (weight, bias,
// running_mean, running_var, num_batches_tracked), so state dicts and
// checkpoints move between the two. Input (N, C, ...) of rank 2 or more.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // A null process_group means the default group (ddp::default_process_group(),
  // a UsageError when there is none), as PyTorch's None.
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options, std::shared_ptr<ProcessGroup> process_group = nullptr);

  // Training: statistics over every rank of the group (a collective: every
  // rank of the group must call it, in the same order as its other
  // collectives). Evaluation, or a group of one: plain batch norm, no
  // communication.
  torch::Tensor forward(const torch::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }

  SyncBatchNormOptions options;
  torch::Tensor weight, bias;
  torch::Tensor running_mean, running_var, num_batches_tracked;

 private:
  friend struct detail::BatchNormConversion;
  struct Adopted {
    torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  };
  // Registers `adopted`'s tensors, not fresh ones, in the first reset().
  SyncBatchNormImpl(const SyncBatchNormOptions& options, std::shared_ptr<ProcessGroup> process_group,
                    Adopted adopted);

  std::shared_ptr<ProcessGroup> process_group_;
  c10::optional<Adopted> adopted_;
};
TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm1d/2d/3d in `module` (itself included)
// with a SyncBatchNorm on `process_group` that shares its parameter and
// buffer tensors and copies its options and training mode, as PyTorch's
// SyncBatchNorm.convert_sync_batchnorm. Returns `module`, or the new layer
// when `module` is itself a BatchNorm. Layers are found and replaced in the
// registry (children) and in Sequential, ModuleList and ModuleDict entries.
// Throws UsageError, before changing anything, when a BatchNorm is also held
// elsewhere (a typed member of its parent, or a pointer of the caller's),
// where the replacement would not take effect.
// A null process_group means the default group.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          std::shared_ptr<ProcessGroup> process_group = nullptr);

// The same for a module holder (a TORCH_MODULE type or a Sequential),
// converted in place; its root must not itself be a BatchNorm.
template <typename ModuleType>
void convert_sync_batchnorm(torch::nn::ModuleHolder<ModuleType>& module,
                            std::shared_ptr<ProcessGroup> process_group = nullptr) {
  if (!process_group) process_group = default_process_group();
  auto root = std::static_pointer_cast<torch::nn::Module>(module.ptr());
  if (convert_sync_batchnorm(root, process_group) != root)
    throw UsageError(rank_tag(*process_group) +
                     ": convert_sync_batchnorm: this holder is itself a BatchNorm, which cannot become a "
                     "SyncBatchNorm in place; pass its ptr() and keep the module returned");
}

}  // namespace ddp
