// ddp::CheckpointWriter: a checkpoint staged on the training thread (host
// copies of the model's tensors and the optimizer's state, into buffers kept
// from one save to the next) and written by a thread of its own.
#include <torch/torch.h>

#include <iostream>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include "checkpoint_io.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "ddp/train/checkpoint.h"

namespace ddp {
namespace detail {

// Host copies: the i-th tensor staged goes to the i-th buffer when that has
// its shape and dtype, so that a run's saves allocate once; page-locked for
// a GPU's tensors, copied without blocking (synchronized before the write).
class StagingBuffers {
 public:
  void restart() { next_ = 0; }
  at::Tensor copy(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (next_ == buffers_.size()) buffers_.emplace_back();
    at::Tensor& buffer = buffers_[next_++];
    if (!buffer.defined() || buffer.sizes() != t.sizes() || buffer.scalar_type() != t.scalar_type()) {
      auto options = t.options().device(torch::kCPU).requires_grad(false);
      buffer = torch::empty(t.sizes(), t.is_cuda() ? options.pinned_memory(true) : options);
    }
    buffer.copy_(t.detach(), /*non_blocking=*/t.is_cuda());
    from_gpu = from_gpu || t.is_cuda();
    return buffer;
  }
  bool from_gpu = false;  // a copy may still be on its way

 private:
  std::vector<at::Tensor> buffers_;
  size_t next_ = 0;
};

}  // namespace detail

namespace {

using detail::StagingBuffers;
using torch::optim::OptimizerParamState;

// A copy of one parameter's state for LibTorch's SGD, Adam, AdamW, Adagrad
// and RMSprop; null for another kind (its optimizer is serialized at once).
std::unique_ptr<OptimizerParamState> copy_of(const OptimizerParamState& from, StagingBuffers& staging) {
  using namespace torch::optim;
  auto c = [&](const at::Tensor& t) { return staging.copy(t); };
  if (const auto* s = dynamic_cast<const AdamParamState*>(&from)) {
    auto out = std::make_unique<AdamParamState>(*s);
    out->exp_avg(c(s->exp_avg())).exp_avg_sq(c(s->exp_avg_sq())).max_exp_avg_sq(c(s->max_exp_avg_sq()));
    return out;
  }
  if (const auto* s = dynamic_cast<const AdamWParamState*>(&from)) {
    auto out = std::make_unique<AdamWParamState>(*s);
    out->exp_avg(c(s->exp_avg())).exp_avg_sq(c(s->exp_avg_sq())).max_exp_avg_sq(c(s->max_exp_avg_sq()));
    return out;
  }
  if (const auto* s = dynamic_cast<const SGDParamState*>(&from)) {
    auto out = std::make_unique<SGDParamState>(*s);
    out->momentum_buffer(c(s->momentum_buffer()));
    return out;
  }
  if (const auto* s = dynamic_cast<const AdagradParamState*>(&from)) {
    auto out = std::make_unique<AdagradParamState>(*s);
    out->sum(c(s->sum()));
    return out;
  }
  if (const auto* s = dynamic_cast<const RMSpropParamState*>(&from)) {
    auto out = std::make_unique<RMSpropParamState>(*s);
    out->square_avg(c(s->square_avg())).momentum_buffer(c(s->momentum_buffer())).grad_avg(c(s->grad_avg()));
    return out;
  }
  return nullptr;
}

// The optimizer's archive over staged copies of its state (its options are
// values already). A ZeRO optimizer's consolidated state is a snapshot of
// its own; an optimizer of another kind is serialized here, on this thread.
void stage_optimizer(const torch::optim::Optimizer& optimizer, StagingBuffers& staging,
                     detail::CheckpointParts& parts) {
  auto archive = std::make_shared<torch::serialize::OutputArchive>();
  if (dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) {
    optimizer.save(*archive);
    parts.optimizer_archive = archive;
    return;
  }
  auto& live = const_cast<torch::optim::Optimizer&>(optimizer).state();
  std::remove_reference_t<decltype(live)> copies;
  for (const auto& [key, state] : live) {
    auto copy = copy_of(*state, staging);
    if (!copy) {
      std::ostringstream bytes;
      torch::serialize::OutputArchive now;
      optimizer.save(now);
      now.save_to(bytes);
      parts.optimizer = bytes.str();
      return;
    }
    copies[key] = std::move(copy);
  }
  // The optimizer saves its state(): the copies, for as long as it takes.
  std::swap(live, copies);
  try {
    optimizer.save(*archive);
  } catch (...) {
    std::swap(live, copies);
    throw;
  }
  std::swap(live, copies);
  parts.optimizer_archive = archive;
}

}  // namespace

struct CheckpointWriter::Impl {
  explicit Impl(ProcessGroup& pg) : pg(pg) {}
  ProcessGroup& pg;
  detail::StagingBuffers staging;
  std::thread thread;
  std::string path;   // of the save in flight, "" when none
  std::string error;  // rank 0: why it failed
};

CheckpointWriter::CheckpointWriter(ProcessGroup& pg) : impl_(std::make_unique<Impl>(pg)) {}

CheckpointWriter::~CheckpointWriter() {
  if (impl_->thread.joinable()) impl_->thread.join();
  if (!impl_->error.empty())
    std::cerr << rank_tag(impl_->pg) << ": writing the checkpoint " << impl_->path
              << " in the background failed: " << impl_->error << std::endl;
}

bool CheckpointWriter::busy() const { return !impl_->path.empty(); }

void CheckpointWriter::wait() {
  Impl& s = *impl_;
  if (s.path.empty()) return;
  if (s.thread.joinable()) s.thread.join();
  const std::string path = std::exchange(s.path, std::string());
  const std::string error = std::exchange(s.error, std::string());
  detail::share_verdict(s.pg, error.empty(), "to write the checkpoint " + path + " in the background");
  if (!error.empty())
    throw CheckpointError(rank_tag(s.pg) + ": writing the checkpoint " + path + " in the background failed: " +
                          error);
}

void CheckpointWriter::save(const std::string& path, const torch::nn::Module& model,
                            const torch::optim::Optimizer& optimizer, const TrainState& state) {
  Impl& s = *impl_;
  wait();
  std::string error;
  if (const auto* zero = dynamic_cast<const ZeroRedundancyOptimizer*>(&optimizer)) {
    try {
      const_cast<ZeroRedundancyOptimizer*>(zero)->consolidate_state_dict(0);
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      error = std::string("consolidating the ZeRO optimizer's state: ") + e.what();
    }
  }
  auto all_rng = s.pg.allgather(detail::cpu_rng_state().to(s.pg.device()));
  s.path = path;
  if (s.pg.rank() != 0) return;  // rank 0's verdict comes at the next save or wait()
  s.error = error;
  if (!error.empty()) return;
  try {
    torch::NoGradGuard no_grad;
    detail::CheckpointParts parts;
    s.staging.restart();
    for (const auto& item : state_dict(model)) parts.model.insert(item.key(), s.staging.copy(item.value()));
    stage_optimizer(optimizer, s.staging, parts);
    parts.position = state;
    parts.scaler = state.scaler ? state.scaler->state_dict() : std::nullopt;
    parts.world_size = s.pg.size();
    for (const auto& t : all_rng) parts.rng.push_back(t.cpu());
    if (s.staging.from_gpu) torch::cuda::synchronize();
    s.thread = std::thread([&s, path, parts = std::move(parts)] {
      try {
        detail::write_checkpoint_file(path, detail::pickle_checkpoint(parts));
      } catch (const std::exception& e) {
        s.error = e.what();
      }
    });
  } catch (const std::exception& e) {
    s.error = std::string("staging its state: ") + e.what();
  }
}

}  // namespace ddp
