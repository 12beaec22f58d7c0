// ddp::GradScaler: loss scaling for float16 mixed precision, with the
// semantics of PyTorch's torch.cuda.amp.GradScaler, made safe for any
// gradient layout across ranks: the inf/NaN flag that decides whether a step
// is skipped is all-reduced, so every rank skips the same steps and keeps the
// same scale even when only one rank's gradients overflowed (a ZeRO shard, a
// compression hook, gradients touched after backward).
//
//   ddp::GradScaler scaler(pg);                      // or GradScalerOptions().enabled(device.is_cuda())
//   for (...) {
//     optimizer.zero_grad();
//     torch::Tensor loss;
//     {
//       ddp::Autocast autocast(torch::kCUDA);        // ddp/amp/autocast.h
//       loss = torch::nll_loss(model(x), y);
//     }
//     scaler.scale(loss).backward();                 // gradients of loss * scale
//     scaler.step(optimizer);                        // unscales; skipped (on every rank) on inf/NaN
//     scaler.update();                               // backs off after a skip, grows after growth_interval good steps
//   }
//
// A disabled scaler passes everything through (scale() returns its input,
// step() steps), so one loop serves float32, bfloat16 and float16 training.
// bfloat16 (CPU autocast) has float32's range and needs no scaler.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;  // 2^16
  TORCH_ARG(double, growth_factor) = 2.0;   // > 1
  TORCH_ARG(double, backoff_factor) = 0.5;  // in (0, 1)
  TORCH_ARG(int64_t, growth_interval) = 2000;
  TORCH_ARG(bool, enabled) = true;
};

// What state_dict() returns: PyTorch's five entries ("scale",
// "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"),
// or none at all from a disabled scaler (PyTorch's empty dict).
struct GradScalerState {
  double scale = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  int64_t growth_interval = 0;
  int64_t growth_tracker = 0;  // consecutive steps without inf/NaN since the last change
};

class GradScaler;

namespace detail {
// The training kit on a recoverable group: unscale_() (its inf/NaN
// all-reduce) before the step's vote, unless done, so that no collective
// runs between the vote and the update; and, when the step does not commit,
// forget it (the step is computed again).
void unscale_before_vote(GradScaler& scaler, torch::optim::Optimizer& optimizer);
void forget_unscale(GradScaler& scaler, torch::optim::Optimizer& optimizer);
}  // namespace detail

class GradScaler {
 public:
  // With a process group of more than one rank, unscale_() (and step(),
  // which calls it) is collective: one all-reduce of the inf/NaN flag. A
  // null pg means the default group (ddp::init_process_group's) when there
  // is one at unscale_(); in a process without one the scaler is PyTorch's,
  // rank by rank. Throws ddp::UsageError for invalid options.
  explicit GradScaler(std::shared_ptr<ProcessGroup> pg = nullptr, GradScalerOptions options = {});
  explicit GradScaler(GradScalerOptions options, std::shared_ptr<ProcessGroup> pg = nullptr)
      : GradScaler(std::move(pg), options) {}

  // outputs * scale (a one-element float32 tensor on the outputs' device,
  // made at the first call), or outputs unchanged when disabled.
  torch::Tensor scale(const torch::Tensor& outputs);
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  // Divides the optimizer's gradients by the scale and records whether any
  // was inf or NaN on any rank. At most once per optimizer between update()s
  // (call it to clip unscaled gradients before step()).
  void unscale_(torch::optim::Optimizer& optimizer);

  // unscale_() unless done, then optimizer.step() unless a rank found
  // inf/NaN. Returns whether the optimizer stepped (the same on every rank).
  bool step(torch::optim::Optimizer& optimizer);

  // After every optimizer's step(): a skipped step multiplies the scale by
  // backoff_factor; growth_interval steps in a row without one multiply it
  // by growth_factor (unless that overflows float32).
  void update();
  // Sets the scale instead.
  void update(double new_scale);

  // 1.0 when disabled; the initial scale before the first scale().
  double get_scale() const;
  double get_growth_factor() const { return options_.growth_factor(); }
  void set_growth_factor(double factor);
  double get_backoff_factor() const { return options_.backoff_factor(); }
  void set_backoff_factor(double factor);
  int64_t get_growth_interval() const { return options_.growth_interval(); }
  void set_growth_interval(int64_t interval);
  int64_t get_growth_tracker() const;
  bool is_enabled() const { return options_.enabled(); }

  // Call after update() to checkpoint; none when disabled.
  std::optional<GradScalerState> state_dict() const;
  // A no-op when disabled; throws ddp::UsageError for none (a checkpoint
  // of a disabled scaler) or invalid values.
  void load_state_dict(const std::optional<GradScalerState>& state);

 private:
  friend void detail::unscale_before_vote(GradScaler&, torch::optim::Optimizer&);
  friend void detail::forget_unscale(GradScaler&, torch::optim::Optimizer&);
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    torch::Tensor found_inf;  // float32, one element, on the scale's device; > 0: a rank found inf/NaN
  };
  void check_started(const char* what) const;

  std::shared_ptr<ProcessGroup> pg_;
  GradScalerOptions options_;
  int64_t init_growth_tracker_ = 0;
  torch::Tensor scale_;           // float32 (1,), made lazily on the first scale()'s device
  torch::Tensor growth_tracker_;  // int32 (1,), beside it
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace ddp
