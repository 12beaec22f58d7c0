#include "ddp/parallel/powersgd_hook.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "ddp/parallel/default_hooks.h"
#include "parallel/numpy_random.h"
#include "usage_check.h"

namespace ddp::hooks {

namespace detail {

int64_t numpy_randint(std::mt19937& engine, int64_t high) {
  TORCH_CHECK(high > 0 && high <= (int64_t{1} << 32), "numpy_randint: high ", high, " out of range");
  const uint32_t range = static_cast<uint32_t>(high - 1);  // numpy's inclusive bound
  if (range == 0) return 0;
  if (range == std::numeric_limits<uint32_t>::max()) return engine();
  uint32_t mask = range;
  for (int shift = 1; shift < 32; shift <<= 1) mask |= mask >> shift;
  uint32_t value;
  do {
    value = static_cast<uint32_t>(engine()) & mask;
  } while (value > range);
  return value;
}

}  // namespace detail

namespace {

std::string state_who(const std::shared_ptr<ProcessGroup>& pg) {
  if (pg) return c10::str("rank ", pg->rank(), ": PowerSGDState: ");
  if (is_initialized()) return c10::str("rank ", default_process_group()->rank(), ": PowerSGDState: ");
  return "PowerSGDState: ";
}

// Gram-Schmidt on each matrix of the batch [b, n, r], column by column, in
// place. With epsilon 0 an all-zero column becomes NaN, as in PyTorch.
void orthogonalize_gram_schmidt(const at::Tensor& matrices, double epsilon) {
  const int64_t num_cols = matrices.size(2);
  for (int64_t i = 0; i < num_cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    // torch.norm(col, dim=1, keepdim=True), exactly: the same kernel, the same bits.
    at::Tensor norm = at::frobenius_norm(col, {1}, true);
    if (epsilon == 0)
      col.div_(norm);
    else
      col.div_(norm + epsilon);
    if (i + 1 < num_cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, num_cols - i - 1);
      rest.sub_(at::sum(col * rest, {1}, true) * col);
    }
  }
}

// As PyTorch: Gram-Schmidt for thin matrices (r <= 2) and half types, which
// LAPACK's QR does not take; a QR decomposition otherwise, written over the
// input as torch.linalg.qr(m, out=(m, r)) does.
void orthogonalize(const at::Tensor& matrices, double epsilon) {
  TORCH_CHECK(matrices.dim() == 3 && matrices.size(2) <= matrices.size(1), "orthogonalize: bad shape ",
              matrices.sizes());
  const int64_t rank = matrices.size(2);
  const auto dtype = matrices.scalar_type();
  if (rank <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    orthogonalize_gram_schmidt(matrices, epsilon);
  } else {
    at::Tensor q = matrices;
    at::Tensor r = at::empty({matrices.size(0), rank, rank}, matrices.options());
    at::linalg_qr_out(q, r, matrices);
  }
}

// PowerSGD multiplies with bmm: LibTorch's CPU kernels have no float16 one.
void check_dtype(const ProcessGroup& pg, const GradBucket& bucket) {
  const at::Tensor& buffer = bucket.buffer();
  const auto dtype = buffer.scalar_type();
  if (dtype == at::kFloat || dtype == at::kDouble) return;
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  if (half && !buffer.device().is_cpu()) return;
  check_usage(false, "rank ", pg.rank(), ": powerSGD_hook: bucket ", bucket.index(), " holds ", dtype,
              " gradients on ", buffer.device().str(), ", which PowerSGD cannot compress here",
              half ? " (LibTorch has no float16 batched matrix product on CPUs)" : "",
              ". Keep float32 or float64 parameters on CPUs (float16 ones on GPUs), or use allreduce_hook or "
              "fp16_compress_hook for this model.");
}

// A bucket's compression in flight: what its three continuations share.
struct InFlight {
  std::shared_ptr<ProcessGroup> pg;
  at::Tensor input;
  at::Tensor input_copy;  // error feedback: the input before decompression
  std::vector<at::Tensor> uncompressed;
  // [b, n, m] per group of same-shaped matrices (b > 1 only when batching,
  // as a stacked copy of `originals`), and their P [b, n, r] and Q [b, m, r]
  // views of the bucket's P and Q memory.
  std::vector<at::Tensor> to_compress, ps, qs;
  std::vector<std::vector<at::Tensor>> originals;
  at::Tensor p_memory, q_memory;
};

}  // namespace

PowerSGDState::PowerSGDState(std::shared_ptr<ProcessGroup> process_group, PowerSGDOptions options)
    : process_group_(std::move(process_group)),
      options_(options),
      rng_(static_cast<uint32_t>(options.random_seed() & 0xffffffff)) {  // its range is checked below
  const std::string who = state_who(process_group_);
  check_usage(!((options_.use_error_feedback() || options_.warm_start()) && options_.start_powerSGD_iter() <= 1), who,
              "start_powerSGD_iter is ", options_.start_powerSGD_iter(),
              ", but it must be > 1 when use_error_feedback or warm_start is on: DDP rebuilds its buckets after the "
              "first iteration, so PowerSGD can only start after the first two. Use start_powerSGD_iter(2) or "
              "more, or turn off both use_error_feedback and warm_start.");
  check_usage(options_.matrix_approximation_rank() >= 1, who, "matrix_approximation_rank is ",
              options_.matrix_approximation_rank(), "; use 1 or more (PyTorch suggests 1, 2, 4, ...).");
  check_usage(options_.random_seed() >= 0 && options_.random_seed() <= int64_t{0xffffffff}, who, "random_seed is ",
              options_.random_seed(), "; use a seed from 0 to 2^32 - 1, as numpy.random.RandomState, the same on every rank.");
  check_usage(!std::isnan(options_.min_compression_rate()), who,
              "min_compression_rate is NaN; use a number such as 2 (the default).");
  check_usage(options_.orthogonalization_epsilon() >= 0, who, "orthogonalization_epsilon is ",
              options_.orthogonalization_epsilon(), "; use 0 (the default) or a small positive value such as 1e-8.");
  options_.compression_stats_logging_frequency(std::max<int64_t>(1, options_.compression_stats_logging_frequency()));
}

PowerSGDState::CompressionStats PowerSGDState::compression_stats() const {
  CompressionStats s;
  s.numel_before_compression = total_numel_before_compression_;
  s.numel_after_compression = total_numel_after_compression_;
  if (total_numel_after_compression_ > 0)
    s.compress_rate = static_cast<double>(total_numel_before_compression_) / total_numel_after_compression_;
  return s;
}

// An iteration ends with its last bucket.
void PowerSGDState::maybe_increase_iter(bool last_bucket) {
  if (last_bucket) ++iter_;
}

namespace {

// Error feedback: this iteration also sends what the last one lost. Keeps
// the input as it is now, for the next iteration's error.
void add_error_feedback(InFlight& c, std::map<size_t, at::Tensor>& error_dict, size_t index) {
  const at::Tensor& input = c.input;
  auto it = error_dict.find(index);
  if (it != error_dict.end()) {
    check_usage(it->second.numel() == input.numel(), "rank ", c.pg->rank(), ": powerSGD_hook: bucket ", index,
                " now holds ", input.numel(), " elements, its error feedback ", it->second.numel(),
                ": the buckets changed after compression started (bucket_cap_mb(\"auto\") still tuning?). "
                "Start compressing later (PowerSGDOptions::start_powerSGD_iter) or fix the bucket size.");
    input.add_(it->second);
  } else {
    error_dict[index] = at::zeros({input.size(0)}, input.options());
  }
  c.input_copy = input.clone();
}

// The gradients worth compressing, as matrices [rows, -1], and the sizes
// of their Ps and Qs; the others go to c.uncompressed. Counts both in the
// compression statistics.
struct Selection {
  std::vector<at::Tensor> matrices;
  int64_t total_ps = 0, total_qs = 0;
};

Selection select_matrices(const std::vector<at::Tensor>& gradients, const PowerSGDOptions& opt, int64_t& numel_before,
                          int64_t& numel_after, InFlight& c) {
  Selection out;
  for (const at::Tensor& tensor : gradients) {
    // A scalar or an empty gradient has no matrix to approximate (PyTorch
    // fails on them): they go uncompressed.
    if (tensor.dim() == 0 || tensor.numel() == 0) {
      numel_before += tensor.numel();
      numel_after += tensor.numel();
      c.uncompressed.push_back(tensor);
      continue;
    }
    at::Tensor matrix = tensor.view({tensor.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t r = std::min({n, m, opt.matrix_approximation_rank()});
    const int64_t uncompressed_size = n * m, compressed_size = (n + m) * r;
    numel_before += uncompressed_size;
    if (static_cast<double>(compressed_size) * opt.min_compression_rate() < static_cast<double>(uncompressed_size)) {
      out.matrices.push_back(matrix);
      out.total_ps += n * r;
      out.total_qs += m * r;
      numel_after += compressed_size;
    } else {
      c.uncompressed.push_back(tensor);
      numel_after += uncompressed_size;
    }
  }
  return out;
}

// The uncompressed ones travel together, in one all-reduce.
at::Tensor flatten_uncompressed(const InFlight& c, const at::TensorOptions& options) {
  if (c.uncompressed.empty()) return at::empty({0}, options);
  std::vector<at::Tensor> flat;
  for (const auto& t : c.uncompressed) flat.push_back(t.view({-1}));
  return at::cat(flat);
}

// Grouped by shape, in the order each shape first appears: P and Q lie in
// their memory in this order, and the random Qs are drawn in it.
void group_by_shape(const std::vector<at::Tensor>& matrices, bool batch_same_shape, InFlight& c) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> by_shape;
  for (const auto& matrix : matrices) {
    auto shape = matrix.sizes().vec();
    auto group = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& g) { return g.first == shape; });
    if (group == by_shape.end()) group = by_shape.insert(by_shape.end(), {shape, {}});
    group->second.push_back(matrix);
  }
  for (auto& [shape, group] : by_shape) {
    if (batch_same_shape && group.size() > 1) {
      c.to_compress.push_back(at::stack(group));
      c.originals.push_back(group);
    } else {
      for (const auto& matrix : group) {
        c.to_compress.push_back(matrix.unsqueeze(0));
        c.originals.emplace_back();  // the matrix itself: nothing to copy back
      }
    }
  }
}

// Each group's P [b, n, r] and Q [b, m, r], views of the bucket's P and Q memory.
void view_ps_and_qs(InFlight& c, int64_t approximation_rank) {
  int64_t p_offset = 0, q_offset = 0;
  for (const auto& tensor : c.to_compress) {
    const int64_t b = tensor.size(0), n = tensor.size(1), m = tensor.size(2);
    const int64_t r = std::min({n, m, approximation_rank});
    c.ps.push_back(c.p_memory.narrow(0, p_offset, b * n * r).view({b, n, r}));
    c.qs.push_back(c.q_memory.narrow(0, q_offset, b * m * r).view({b, m, r}));
    p_offset += b * n * r;
    q_offset += b * m * r;
  }
}

// The Qs, orthogonalized: last iteration's (the warm start), or random ones.
void prepare_qs(InFlight& c, bool randomize, std::mt19937& rng, double epsilon) {
  if (!randomize) {
    for (const auto& q : c.qs) orthogonalize(q, epsilon);
    return;
  }
  // Every rank draws the same seed, and a new one each time. A generator
  // of our own, on the CPU, as PyTorch's forked one: the program's global
  // generator is neither read nor advanced.
  const int64_t seed = detail::numpy_randint(rng, 1000000000);
  at::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  for (const auto& q : c.qs) {
    q.copy_(at::randn(q.sizes(), generator, at::TensorOptions().dtype(q.scalar_type()).device(at::kCPU)));
    orthogonalize(q, epsilon);
  }
}

// Once the uncompressed gradients are summed: their average back in place,
// then the sum of the Ps.
at::Tensor finish_uncompressed_and_share_ps(InFlight& c, const at::Tensor& reduced, int world) {
  reduced.div_(world);
  int64_t offset = 0;
  for (const auto& t : c.uncompressed) {
    t.copy_(reduced.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
  // Orthogonalised next, so the sum needs no division.
  c.pg->allreduce(c.p_memory).wait();
  return c.p_memory;
}

// Q = M^T P on the orthogonalized Ps, summed over the ranks.
at::Tensor compute_and_share_qs(InFlight& c, double epsilon) {
  for (const auto& p : c.ps) orthogonalize(p, epsilon);
  for (size_t k = 0; k < c.to_compress.size(); ++k) at::bmm_out(c.qs[k], c.to_compress[k].transpose(1, 2), c.ps[k]);
  c.pg->allreduce(c.q_memory).wait();
  return c.q_memory;
}

// M = P Q^T with the averaged Q, copied back into batched matrices' originals.
void decompress(InFlight& c, int world) {
  c.q_memory.div_(world);
  for (size_t k = 0; k < c.to_compress.size(); ++k) at::bmm_out(c.to_compress[k], c.ps[k], c.qs[k].transpose(1, 2));
  for (size_t k = 0; k < c.to_compress.size(); ++k)
    for (size_t i = 0; i < c.originals[k].size(); ++i) c.originals[k][i].copy_(c.to_compress[k][i]);
}

}  // namespace

CommFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  torch::NoGradGuard no_grad;
  auto pg = state.process_group_ ? state.process_group_ : default_process_group();
  check_dtype(*pg, bucket);
  const auto& opt = state.options_;
  if (state.iter_ < opt.start_powerSGD_iter()) {
    state.maybe_increase_iter(bucket.is_last());
    return allreduce_hook(pg, bucket);
  }

  auto c = std::make_shared<InFlight>();
  c->pg = pg;
  c->input = bucket.buffer();
  const auto options = c->input.options();
  const size_t index = bucket.index();
  const bool is_last = bucket.is_last();

  if (opt.use_error_feedback()) add_error_feedback(*c, state.error_dict_, index);
  const Selection selection = select_matrices(bucket.gradients(), opt, state.total_numel_before_compression_,
                                              state.total_numel_after_compression_, *c);
  at::Tensor uncompressed_memory = flatten_uncompressed(*c, options);

  // P and Q memory: per iteration, or kept for the warm start.
  bool randomize_qs = false;
  if (!opt.warm_start() || state.p_memory_dict_.count(index) == 0) {
    randomize_qs = true;
    state.p_memory_dict_[index] = at::empty({selection.total_ps}, options);
    state.q_memory_dict_[index] = at::empty({selection.total_qs}, options);
  }
  c->p_memory = state.p_memory_dict_[index];
  c->q_memory = state.q_memory_dict_[index];

  group_by_shape(selection.matrices, opt.batch_tensors_with_same_shape(), *c);
  view_ps_and_qs(*c, opt.matrix_approximation_rank());
  prepare_qs(*c, randomize_qs, state.rng_, opt.orthogonalization_epsilon());
  for (size_t k = 0; k < c->to_compress.size(); ++k) at::bmm_out(c->ps[k], c->to_compress[k], c->qs[k]);

  // Three continuations: the uncompressed sum, then P's, then Q's.
  PowerSGDState* s = &state;
  const int world = pg->size();
  Work uncompressed_work = pg->allreduce(uncompressed_memory);
  return CommFuture(std::move(uncompressed_work), uncompressed_memory)
      .then([c, world](const at::Tensor& reduced) { return finish_uncompressed_and_share_ps(*c, reduced, world); })
      .then([c, s](const at::Tensor&) { return compute_and_share_qs(*c, s->options_.orthogonalization_epsilon()); })
      .then([c, s, world, index, is_last](const at::Tensor&) {
        decompress(*c, world);
        if (s->options_.use_error_feedback()) s->error_dict_[index] = c->input_copy - c->input;
        if (!s->options_.warm_start()) {
          s->p_memory_dict_.clear();
          s->q_memory_dict_.clear();
        }
        s->maybe_increase_iter(is_last);
        return c->input;
      });
}

}  // namespace ddp::hooks
