#include "ddp/parallel/distributed_sampler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ddp/comm/process_group.h"
#include "ddp/comm/recovery.h"

namespace ddp {

DistributedSampler::DistributedSampler(size_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : state_(std::make_shared<State>()), options_(options) {
  state_->dataset_size = dataset_size;
  set_replicas(num_replicas, rank);
  reset();
}

void DistributedSampler::set_replicas(int num_replicas, int rank) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw UsageError("DistributedSampler: rank " + std::to_string(rank) + " is not in [0, " +
                     std::to_string(num_replicas) + ")");
  state_->num_replicas = num_replicas;
  state_->rank = rank;
  if (state_->group) state_->generation = state_->group->generation;
}

DistributedSampler::DistributedSampler(size_t dataset_size, const ProcessGroup& pg, DistributedSamplerOptions options)
    : DistributedSampler(dataset_size, pg.size(), pg.rank(), options) {
  if (const auto* recoverable = dynamic_cast<const RecoverableGroup*>(&pg)) {
    state_->group = recoverable->position();
    state_->generation = state_->group->generation;
  }
}

void DistributedSampler::set_epoch(int64_t epoch) {
  state_->epoch = epoch;
  state_->start = 0;
}
int64_t DistributedSampler::epoch() const { return state_->epoch; }

void DistributedSampler::set_start(size_t positions_taken) {
  if (positions_taken > state_->dataset_size)
    throw UsageError("DistributedSampler: start " + std::to_string(positions_taken) + " is beyond the " +
                     std::to_string(state_->dataset_size) + " samples of the data set");
  state_->start = positions_taken;
}
size_t DistributedSampler::start() const { return state_->start; }
size_t DistributedSampler::dataset_size() const { return state_->dataset_size; }

// Counts below are of the positions not yet taken: N - start (set_start and
// reset keep start <= N).
size_t DistributedSampler::num_samples() const {
  const size_t n = state_->dataset_size - state_->start, w = static_cast<size_t>(state_->num_replicas),
               r = static_cast<size_t>(state_->rank);
  if (options_.drop_last()) return n / w;
  if (options_.pad()) return (n + w - 1) / w;
  return n / w + (r < n % w ? 1 : 0);
}

size_t DistributedSampler::total_size() const {
  const size_t n = state_->dataset_size - state_->start, w = static_cast<size_t>(state_->num_replicas);
  if (options_.drop_last()) return n / w * w;
  if (options_.pad()) return (n + w - 1) / w * w;
  return n;
}

std::vector<size_t> DistributedSampler::indices() const {
  const size_t n = state_->dataset_size;
  std::vector<size_t> order(n);
  if (options_.shuffle()) {
    // As PyTorch: g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed() + static_cast<uint64_t>(state_->epoch));
    auto perm = torch::randperm(static_cast<int64_t>(n), gen, torch::kLong);
    const auto* p = perm.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<size_t>(p[i]);
  } else {
    for (size_t i = 0; i < n; ++i) order[i] = i;
  }
  // Positions start .. end-1 of the order, padded beyond n by repeating the
  // order from its start, as often as needed (PyTorch's rule): the same
  // padding as an epoch without a start.
  const size_t start = state_->start, end = start + total_size();
  std::vector<size_t> mine;
  mine.reserve(num_samples());
  if (n == 0) return mine;
  for (size_t i = start + static_cast<size_t>(state_->rank); i < end; i += static_cast<size_t>(state_->num_replicas))
    mine.push_back(order[i % n]);
  return mine;
}

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  if (const auto& group = state_->group; group && group->generation != state_->generation)
    set_replicas(group->size, group->rank);
  if (new_size) {
    state_->dataset_size = *new_size;
    state_->start = std::min(state_->start, *new_size);
  }
  current_ = indices();
  position_ = 0;
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (position_ >= current_.size()) return c10::nullopt;
  const size_t end = std::min(current_.size(), position_ + batch_size);
  std::vector<size_t> batch(current_.begin() + static_cast<std::ptrdiff_t>(position_),
                            current_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(state_->epoch, torch::kLong), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<int64_t>(position_), torch::kLong), /*is_buffer=*/true);
  archive.write("start", torch::tensor(static_cast<int64_t>(state_->start), torch::kLong), /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch = torch::empty({}, torch::kLong), position = torch::empty({}, torch::kLong);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  state_->epoch = epoch.item<int64_t>();
  // Absent from archives written before the start existed.
  torch::Tensor start = torch::zeros({}, torch::kLong);
  if (archive.try_read("start", start, /*is_buffer=*/true))
    state_->start = std::min(state_->dataset_size, static_cast<size_t>(std::max<int64_t>(0, start.item<int64_t>())));
  else
    state_->start = 0;
  current_ = indices();
  position_ = std::min(current_.size(), static_cast<size_t>(position.item<int64_t>()));
}

}  // namespace ddp
