// PowerSGD gradient compression as a communication hook: PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook, with the same
// state, options, random projections and arithmetic. Each large gradient M is
// sent as two thin matrices P = M Q and Q = M^T P (rank r), the rest as is.
//
//   model.register_comm_hook(
//       ddp::hooks::PowerSGDState(pg, ddp::hooks::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(10)),
//       ddp::hooks::powerSGD_hook);
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>

#include "ddp/parallel/comm_hook.h"
#include "ddp/comm/process_group.h"

namespace ddp::hooks {

// PowerSGDState's options, named and defaulted as the arguments of PyTorch's
// PowerSGDState. Checked together when the state is made.
struct PowerSGDOptions {
  // r: how thin P and Q are. Lower compresses more and approximates worse;
  // PyTorch suggests 1, then 2, 4, ... until accuracy suffices. >= 1.
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  // Iterations (backward passes) of plain all-reduce before compressing.
  // > 1 with error feedback or warm start: DDP rebuilds its buckets after
  // the first iteration, which would invalidate what they remember.
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  // A gradient is compressed only if (rows + columns) * r * this < rows * columns;
  // the others (biases, small layers) are all-reduced as they are.
  TORCH_ARG(double, min_compression_rate) = 2;
  // Adds what compression lost in the previous iteration to this one's
  // gradient; costs one bucket-sized tensor per bucket.
  TORCH_ARG(bool, use_error_feedback) = true;
  // Starts each iteration's power iteration from the previous Q instead of a
  // fresh random one; costs P and Q per bucket.
  TORCH_ARG(bool, warm_start) = true;
  // Added to every column norm in the orthogonalisation: a small value
  // (1e-8) keeps an all-zero column from becoming NaN.
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  // Seeds the generator of the random Qs, as numpy.random.RandomState(seed):
  // every rank must use the same. 0 to 2^32 - 1.
  TORCH_ARG(int64_t, random_seed) = 0;
  // PyTorch logs compression_stats() at INFO level this often (silent
  // unless the program turns INFO on). libddp has no logger: the value is
  // kept for the same signature; read compression_stats() instead.
  TORCH_ARG(int64_t, compression_stats_logging_frequency) = 10000;
  // Compresses gradients of the same shape in one batched product (a copy
  // each); faster when compression is the bottleneck, the same values.
  TORCH_ARG(bool, batch_tensors_with_same_shape) = false;
};

// The hyperparameters and what PowerSGD remembers between iterations, per
// bucket index: the local error, and P and Q for the warm start. One state
// for all buckets of one model; register_comm_hook moves it in.
class PowerSGDState {
 public:
  // process_group null: the default group. Throws UsageError for options
  // that cannot work, as PyTorch's ValueError.
  explicit PowerSGDState(std::shared_ptr<ProcessGroup> process_group, PowerSGDOptions options = {});

  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  const PowerSGDOptions& options() const { return options_; }
  // Iterations seen so far (PyTorch's state.iter).
  int64_t iter() const { return iter_; }

  // As PyTorch's compression_stats(): elements of the compressed iterations'
  // gradients before and after compression, and their ratio (0 before any).
  struct CompressionStats {
    double compress_rate = 0;
    int64_t numel_before_compression = 0;
    int64_t numel_after_compression = 0;
  };
  CompressionStats compression_stats() const;

 private:
  friend CommFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket);
  void maybe_increase_iter(bool last_bucket);

  std::shared_ptr<ProcessGroup> process_group_;
  PowerSGDOptions options_;
  std::mt19937 rng_;  // numpy.random.RandomState(random_seed)'s generator: PyTorch seeds each random Q from it
  std::map<size_t, at::Tensor> error_dict_;
  std::map<size_t, at::Tensor> p_memory_dict_;
  std::map<size_t, at::Tensor> q_memory_dict_;
  int64_t iter_ = 0;
  int64_t total_numel_before_compression_ = 0;
  int64_t total_numel_after_compression_ = 0;
};

// Before start_powerSGD_iter: allreduce_hook. From then on, per bucket:
// the gradients worth compressing (2-D views [rows, -1]) are approximated by
// P Q^T, with P and Q all-reduced (two collectives); the others are
// all-reduced together and divided by the world size. float32 and float64
// buckets on CPU; float16 and bfloat16 too on GPUs.
CommFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace ddp::hooks
