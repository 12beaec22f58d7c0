#include "ddp/nn/sync_batch_norm.h"

#include <torch/csrc/autograd/custom_function.h>

#include "usage_check.h"

namespace ddp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries the process group through autograd's saved data to backward.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(std::shared_ptr<ProcessGroup> pg) : pg(std::move(pg)) {}
  std::shared_ptr<ProcessGroup> pg;
};

// The process group a forward saved for its backward.
ProcessGroup& saved_group(AutogradContext* ctx) {
  return *static_cast<GroupCapsule*>(ctx->saved_data["group"].toCapsule().get())->pg;
}

// Every dimension but the channels'.
std::vector<int64_t> reduce_dims(const at::Tensor& t) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against (N, C, ...).
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

// As PyTorch's SyncBatchNorm function (torch/nn/modules/_functions.py), with
// the statistics combined as batch_norm_gather_stats_with_counts does: each
// rank contributes its count, mean and sum of squared deviations (M2, from
// var_mean: no cancellation), and the ranks' moments are merged exactly
// (Chan et al.) in float64, so that counts are exact whatever the batch.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  // Tensors that may be undefined (no affine, no running statistics) come
  // as optionals: autograd records only those present.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input_in, const c10::optional<at::Tensor>& weight_in,
                            const c10::optional<at::Tensor>& bias_in, const c10::optional<at::Tensor>& running_mean_in,
                            const c10::optional<at::Tensor>& running_var_in, double eps, double momentum,
                            c10::intrusive_ptr<GroupCapsule> group) {
    const at::Tensor weight = weight_in.value_or(at::Tensor()), bias = bias_in.value_or(at::Tensor());
    const at::Tensor running_mean = running_mean_in.value_or(at::Tensor());
    const at::Tensor running_var = running_var_in.value_or(at::Tensor());
    ProcessGroup& pg = *group->pg;
    const at::Tensor input = input_in.contiguous(input_in.suggest_memory_format());
    const int64_t channels = input.size(1);
    // Statistics are accumulated in float32 at least (half and bfloat16
    // inputs), as PyTorch's kernels do.
    const auto acc = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor x = input.to(acc);
    const auto dims = reduce_dims(x);
    const int64_t count = channels > 0 ? input.numel() / channels : 0;
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(input.device());

    // [count, mean (C), M2 (C)] in float64; a rank without samples sends zeros.
    at::Tensor mine = at::zeros({2 * channels + 1}, f64);
    if (count > 0) {
      auto var_and_mean = at::var_mean(x, dims, /*unbiased=*/false, /*keepdim=*/false);
      mine[0] = static_cast<double>(count);
      mine.narrow(0, 1, channels).copy_(std::get<1>(var_and_mean));
      mine.narrow(0, 1 + channels, channels).copy_(std::get<0>(var_and_mean).to(at::kDouble) * static_cast<double>(count));
    }
    const at::Tensor all = at::stack(pg.allgather(mine));  // (W, 2C + 1), rank order
    const at::Tensor counts = all.narrow(1, 0, 1);         // (W, 1)
    const at::Tensor means = all.narrow(1, 1, channels);
    const at::Tensor m2s = all.narrow(1, 1 + channels, channels);
    const double total = counts.sum().item<double>();
    // Ranks with no samples weigh nothing. With no samples anywhere the mean
    // and M2 stay 0, as PyTorch's kernel leaves them.
    at::Tensor mean = at::zeros({channels}, f64), m2 = at::zeros({channels}, f64);
    if (total > 0) {
      mean = (counts * means).sum(0) / total;
      m2 = (m2s + counts * (means - mean).pow(2)).sum(0);
    }
    const at::Tensor invstd = (m2 / total + eps).rsqrt();

    if (running_mean.defined()) {
      // As batch_norm_gather_stats_with_counts: the unbiased variance over
      // the global count.
      running_mean.copy_((running_mean.to(at::kDouble) * (1 - momentum) + mean * momentum).to(running_mean.scalar_type()));
    }
    if (running_var.defined()) {
      const at::Tensor unbiased = m2 / (total - 1);
      running_var.copy_((running_var.to(at::kDouble) * (1 - momentum) + unbiased * momentum).to(running_var.scalar_type()));
    }

    const at::Tensor mean_acc = mean.to(acc), invstd_acc = invstd.to(acc);
    ctx->save_for_backward({input, weight, mean_acc, invstd_acc});
    ctx->saved_data["total"] = total;
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    if (count == 0) return at::empty_like(input);
    // y = x * scale + shift, as the CPU kernel of batch_norm.
    at::Tensor scale = weight.defined() ? invstd_acc * weight.to(acc) : invstd_acc;
    at::Tensor shift = bias.defined() ? bias.to(acc) - mean_acc * scale : -mean_acc * scale;
    return (x * per_channel(scale, x) + per_channel(shift, x)).to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const double total = ctx->saved_data["total"].toDouble();
    ProcessGroup& pg = saved_group(ctx);
    const int64_t channels = input.size(1);
    const bool need_input = ctx->needs_input_grad(0);
    const bool need_weight = weight.defined() && ctx->needs_input_grad(1);
    const bool need_bias = weight.defined() && ctx->needs_input_grad(2);
    variable_list grads(8);

    if (input.numel() == 0) {
      // No samples here, but the peers' all-reduce needs this rank's zeros.
      if (need_input) {
        at::Tensor zeros = at::zeros({2 * channels}, input.options().dtype(mean.scalar_type()));
        pg.allreduce(zeros).wait();
      }
      return grads;
    }

    const auto acc = mean.scalar_type();
    const at::Tensor dy = grad_outputs[0].to(acc);
    const at::Tensor x = input.to(acc);
    const auto dims = reduce_dims(x);
    const at::Tensor xmu = x - per_channel(mean, x);
    at::Tensor sum_dy = dy.sum(dims);
    at::Tensor sum_dy_xmu = (dy * xmu).sum(dims);
    // This rank's share: DDP (or the caller) sums the ranks' shares.
    if (need_weight) grads[1] = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (need_bias) grads[2] = sum_dy.to(weight.scalar_type());

    if (need_input) {
      at::Tensor combined = at::cat({sum_dy, sum_dy_xmu});
      pg.allreduce(combined).wait();
      sum_dy = combined.narrow(0, 0, channels);
      sum_dy_xmu = combined.narrow(0, channels, channels);
      // As batch_norm_backward_elemt.
      const at::Tensor mean_dy = sum_dy / total;
      const at::Tensor proj = sum_dy_xmu / total * invstd * invstd;
      const at::Tensor grad_scale = weight.defined() ? invstd * weight.to(acc) : invstd;
      grads[0] = ((dy - per_channel(mean_dy, x) - xmu * per_channel(proj, x)) * per_channel(grad_scale, x))
                     .to(input.scalar_type());
    }
    return grads;
  }
};

// On CUDA: PyTorch's own SyncBatchNorm function, op for op (its CUDA
// kernels batch_norm_stats, batch_norm_gather_stats_with_counts,
// batch_norm_elemt, batch_norm_backward_reduce and batch_norm_backward_elemt,
// and the same all-gather and all-reduce), so that a CUDA model matches
// torch.nn.SyncBatchNorm bit for bit. Python's SyncBatchNorm refuses CPU
// inputs; the function above is this library's CPU one.
struct SyncBatchNormCudaFunction : torch::autograd::Function<SyncBatchNormCudaFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input_in, const c10::optional<at::Tensor>& weight_in,
                            const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& running_mean,
                            const c10::optional<at::Tensor>& running_var, double eps, double momentum,
                            c10::intrusive_ptr<GroupCapsule> group) {
    ProcessGroup& pg = *group->pg;
    const bool channels_last = input_in.is_contiguous(at::MemoryFormat::ChannelsLast) ||
                               input_in.is_contiguous(at::MemoryFormat::ChannelsLast3d);
    const at::Tensor input = channels_last ? input_in : input_in.contiguous();
    const c10::optional<at::Tensor> weight =
        weight_in ? c10::optional<at::Tensor>(weight_in->contiguous()) : c10::nullopt;
    const int64_t channels = input.size(1);
    at::Tensor combined;
    if (input.numel() > 0) {
      auto [mean, invstd] = at::batch_norm_stats(input, eps);
      const at::Tensor count = at::full({1}, static_cast<double>(input.numel() / channels), mean.options());
      combined = at::cat({mean, invstd, count});
    } else {
      combined = at::zeros({2 * channels + 1}, input.options());
    }
    const at::Tensor all = at::stack(pg.allgather(combined));  // (W, 2C + 1), rank order
    // Ranks without samples drop out, as in PyTorch.
    const at::Tensor mask = all.narrow(1, 2 * channels, 1).squeeze(-1) >= 1;
    const at::Tensor kept = all.index({mask});
    const at::Tensor mean_all = kept.narrow(1, 0, channels), invstd_all = kept.narrow(1, channels, channels);
    const at::Tensor count_all = kept.narrow(1, 2 * channels, 1);
    at::Tensor counts = count_all.reshape({-1});
    if (running_mean && running_mean->defined() && counts.scalar_type() != running_mean->scalar_type())
      counts = counts.to(running_mean->scalar_type());
    auto [mean, invstd] = at::batch_norm_gather_stats_with_counts(input, mean_all, invstd_all, running_mean, running_var,
                                                                  momentum, eps, counts);
    ctx->save_for_backward({input, weight.value_or(at::Tensor()), mean, invstd, count_all.to(at::kInt)});
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    if (input.numel() == 0) return at::empty_like(input);
    return at::batch_norm_elemt(input, weight, bias, mean, invstd, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const at::Tensor& count = saved[4];
    at::Tensor weight = saved[1];
    ProcessGroup& pg = saved_group(ctx);
    const at::Tensor& grad_in = grad_outputs[0];
    const bool channels_last = grad_in.is_contiguous(at::MemoryFormat::ChannelsLast) ||
                               grad_in.is_contiguous(at::MemoryFormat::ChannelsLast3d);
    const at::Tensor grad_output = channels_last ? grad_in : grad_in.contiguous();
    const int64_t channels = input.size(1);
    const bool need_input = ctx->needs_input_grad(0);
    const bool need_weight = weight.defined() && ctx->needs_input_grad(1);
    const bool need_bias = weight.defined() && ctx->needs_input_grad(2);
    variable_list grads(8);
    const auto optional = [](const at::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt; };
    if (input.numel() == 0) {
      // No samples here, but the peers' all-reduce needs this rank's zeros.
      if (need_input) {
        at::Tensor zeros = at::zeros({2 * channels}, input.options());
        pg.allreduce(zeros).wait();
      }
      return grads;
    }
    auto [sum_dy, sum_dy_xmu, grad_weight, grad_bias] = at::batch_norm_backward_reduce(
        grad_output, input, mean, invstd, optional(weight), need_input, need_weight, need_bias);
    if (need_input) {
      at::Tensor combined = at::cat({sum_dy, sum_dy_xmu});
      pg.allreduce(combined).wait();
      if (weight.defined() && weight.scalar_type() != mean.scalar_type()) weight = weight.to(mean.scalar_type());
      grads[0] = at::batch_norm_backward_elemt(grad_output, input, mean, invstd, optional(weight),
                                               combined.narrow(0, 0, channels), combined.narrow(0, channels, channels),
                                               count);
    }
    if (need_weight) grads[1] = grad_weight;
    if (need_bias) grads[2] = grad_bias;
    return grads;
  }
};

}  // namespace

SyncBatchNormOptions::SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_, std::shared_ptr<ProcessGroup> process_group)
    : options(options_), process_group_(process_group ? std::move(process_group) : default_process_group()) {
  check_usage(options.num_features() > 0, rank_tag(*process_group_),
              ": SyncBatchNorm: num_features must be positive, got ", options.num_features());
  check_usage(options.eps() > 0, rank_tag(*process_group_), ": SyncBatchNorm: eps must be positive, got ",
              options.eps());
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_, std::shared_ptr<ProcessGroup> process_group,
                                     Adopted adopted)
    : options(options_), process_group_(std::move(process_group)), adopted_(std::move(adopted)) {
  reset();
}

void SyncBatchNormImpl::reset() {
  // The same names, kinds and shapes as torch::nn::BatchNorm's NormImplBase.
  if (adopted_) {
    // The converted layer's own tensors, requires_grad left as they are.
    const Adopted a = std::move(*adopted_);
    adopted_.reset();
    weight = register_parameter("weight", a.weight, a.weight.defined() && a.weight.requires_grad());
    bias = register_parameter("bias", a.bias, a.bias.defined() && a.bias.requires_grad());
    running_mean = register_buffer("running_mean", a.running_mean);
    running_var = register_buffer("running_var", a.running_var);
    num_batches_tracked = register_buffer("num_batches_tracked", a.num_batches_tracked);
    return;
  }
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({c}));
    bias = register_parameter("bias", torch::empty({c}));
  } else {
    weight = register_parameter("weight", torch::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", torch::Tensor());
    running_var = register_buffer("running_var", torch::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", torch::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  torch::nn::init::ones_(weight);
  torch::nn::init::zeros_(bias);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "ddp::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  const ProcessGroup& pg = *process_group_;
  check_usage(input.dim() >= 2, rank_tag(pg), ": SyncBatchNorm expects an input of 2 or more dimensions (N, C, ...), got ",
              input.dim(), "-D input of shape ", input.sizes());
  check_usage(input.size(1) == options.num_features(), rank_tag(pg), ": SyncBatchNorm(", options.num_features(),
              ") got an input with ", input.size(1), " channels (shape ", input.sizes(),
              "); its dimension 1 must be num_features");

  // As torch.nn.SyncBatchNorm.forward.
  double factor = options.momentum() ? *options.momentum() : 0.0;
  if (is_training() && options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    if (!options.momentum()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  const bool need_sync = is_training() && pg.size() > 1;
  if (!need_sync) {
    // Evaluation (running statistics, or the batch's own without them), or
    // a group of one: no communication.
    return torch::batch_norm(input, weight, bias, running_mean, running_var,
                             is_training() || !options.track_running_stats(), factor, options.eps(),
                             at::globalContext().userEnabledCuDNN());
  }
  auto optional = [](const torch::Tensor& t) { return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt; };
  if (input.is_cuda())
    return SyncBatchNormCudaFunction::apply(input, optional(weight), optional(bias), optional(running_mean),
                                            optional(running_var), options.eps(), factor,
                                            c10::make_intrusive<GroupCapsule>(process_group_));
  return SyncBatchNormFunction::apply(input, optional(weight), optional(bias), optional(running_mean),
                                      optional(running_var), options.eps(), factor,
                                      c10::make_intrusive<GroupCapsule>(process_group_));
}

}  // namespace ddp
