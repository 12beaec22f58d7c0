// ddp::CheckpointWriter: a checkpoint staged on the training thread (host
// copies of the model's tensors and the optimizer's state, into buffers kept
// from one save to the next) and written by a thread of its own.
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <iostream>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include "checkpoint_io.h"
#include "comm/objects/object_exchange.h"
#include "comm/work_handle.h"
#include "param_state_parts.h"
#include "sharded_checkpoint.h"
#include "staging_buffers.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "ddp/train/checkpoint.h"

namespace ddp {
namespace {

using detail::StagingBuffers;

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
    auto copy = detail::copy_state(*state, [&](const at::Tensor& t) { return staging.copy(t); });
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
  Impl(ProcessGroup& pg, CheckpointLayout layout) : pg(pg), layout(layout) {}
  ProcessGroup& pg;
  const CheckpointLayout layout;
  detail::StagingBuffers staging;
  std::thread thread;
  std::string path;   // of the save in flight, "" when none
  std::string error;  // rank 0: why it failed
  // Sharded: this rank's status when the manifest waits for wait() (a group
  // without a store), and the stop asked of rank 0's wait for the others.
  std::optional<std::string> pending_status;
  std::optional<detail::ShardedSave> pending_save;
  std::atomic<bool> abandon{false};

  void save_sharded(const std::string& path, const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                    const TrainState& state);
  void finish_sharded(const detail::ShardedSave& save, const std::shared_ptr<StoreHandle>& store,
                      const std::function<void()>& copied);
};

namespace {

// The statuses of every rank's part of `save`, through the store: each rank
// sets its own; rank 0 waits for the others' (checked every 20 ms, so that
// the training thread's use of the store is never held up), at most the
// group's timeout, or until `abandon`.
std::vector<std::string> statuses_through_store(c10d::Store& store, const detail::ShardedSave& save,
                                                const std::string& mine, std::chrono::milliseconds timeout,
                                                const std::atomic<bool>& abandon) {
  auto key = [&](int r) { return "libddp/checkpoint/" + save.id + "/" + std::to_string(r); };
  store.set(key(save.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> statuses;
  if (save.rank != 0) return statuses;
  std::vector<std::string> keys;
  for (int r = 0; r < save.world; ++r) keys.push_back(key(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!store.check(keys)) {
    if (abandon) throw CheckpointError("the run ended before every rank had written its part");
    if (std::chrono::steady_clock::now() > deadline)
      throw CheckpointError("not every rank reported its part written within the group's timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < save.world; ++r) {
    const auto v = store.get(key(r));
    statuses.emplace_back(v.begin(), v.end());
  }
  return statuses;
}

}  // namespace

void CheckpointWriter::Impl::finish_sharded(const detail::ShardedSave& save, const std::shared_ptr<StoreHandle>& store,
                                            const std::function<void()>& copied) {
  std::string status;
  try {
    copied();
    status = detail::write_shard(save);
  } catch (const std::exception& e) {
    status = std::string("error: copying its part to host memory: ") + e.what();
  }
  if (!store) {
    pending_status = status;
    if (status.rfind("error: ", 0) == 0) error = status.substr(7);
    return;
  }
  try {
    const auto statuses = statuses_through_store(**store, save, status, pg.timeout(), abandon);
    if (save.rank == 0) detail::write_manifest(save, statuses);
  } catch (const std::exception& e) {
    if (save.rank == 0) error = e.what();
  }
  if (error.empty() && status.rfind("error: ", 0) == 0) error = status.substr(7);
}

void CheckpointWriter::Impl::save_sharded(const std::string& dir, const torch::nn::Module& model,
                                          const torch::optim::Optimizer& optimizer, const TrainState& state) {
  staging.restart();
  auto save = detail::stage_sharded(dir, model, optimizer, state, pg, [this](const at::Tensor& t) {
    return staging.copy(t);
  });
  path = dir;
  auto copied = staging.seal();
  auto store = pg.store();
  if (!store) pending_save = save;
  thread = std::thread([this, save = std::move(save), store, copied] { finish_sharded(save, store, copied); });
}

CheckpointWriter::CheckpointWriter(ProcessGroup& pg, CheckpointLayout layout)
    : impl_(std::make_unique<Impl>(pg, layout)) {}

CheckpointWriter::~CheckpointWriter() {
  // Unwinding (a peer lost, say): rank 0 stops waiting for the others' parts.
  impl_->abandon = std::uncaught_exceptions() > 0;
  if (impl_->thread.joinable()) impl_->thread.join();
  if (!impl_->error.empty())
    std::cerr << rank_tag(impl_->pg) << ": writing the checkpoint " << impl_->path
              << " in the background failed: " << impl_->error << std::endl;
}

bool CheckpointWriter::busy() const { return !impl_->path.empty(); }

CheckpointLayout CheckpointWriter::layout() const { return impl_->layout; }

void CheckpointWriter::wait() {
  Impl& s = *impl_;
  if (s.path.empty()) return;
  if (s.thread.joinable()) s.thread.join();
  if (s.pending_status) {  // sharded, on a group without a store: the statuses travel now
    const auto statuses = detail::all_gather_bytes(s.pg, *std::exchange(s.pending_status, std::nullopt));
    if (s.pg.rank() == 0) try {
      detail::write_manifest(*s.pending_save, statuses);
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    s.pending_save.reset();
  }
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
  if (s.layout == CheckpointLayout::sharded) return s.save_sharded(path, model, optimizer, state);
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
    auto copied = s.staging.seal();
    s.thread = std::thread([&s, path, parts = std::move(parts), copied] {
      try {
        copied();
        detail::write_checkpoint_file(path, detail::pickle_checkpoint(parts));
      } catch (const std::exception& e) {
        s.error = e.what();
      }
    });
  } catch (const std::exception& e) {
    s.error = std::string("staging its state: ") + e.what();
  }
}

void save_sharded_checkpoint(const std::string& dir, const torch::nn::Module& model,
                             const torch::optim::Optimizer& optimizer, const TrainState& state, ProcessGroup& pg) {
  CheckpointWriter writer(pg, CheckpointLayout::sharded);
  writer.save(dir, model, optimizer, state);
  writer.wait();
}

}  // namespace ddp
