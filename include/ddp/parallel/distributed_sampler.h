// ddp::DistributedSampler: each rank's share of a dataset, with the semantics
// of PyTorch's torch.utils.data.DistributedSampler:
//   - shuffled by seed + epoch (torch.randperm with a generator seeded
//     seed + epoch: the same permutation as PyTorch, index for index);
//     set_epoch() before every epoch, or every epoch sees the same order;
//   - rank r takes positions r, r + W, r + 2W, ... (a disjoint shard);
//   - equal counts on every rank, by padding with the first indices again, or
//     by dropping the tail with drop_last.
// pad(false) is for evaluation: no index repeats, shards differ by at most
// one sample, and the shards together are the dataset exactly once.
//
// A start position resumes an epoch at any world size (an elastic job that
// lost or gained a node): set_start(K) after set_epoch() hands out the
// positions K, K+1, ... of the epoch's permutation (which does not depend on
// the world size), rank r taking K + r, K + r + W, ...; padding repeats the
// permutation from its start (position 0, 1, ...), exactly as an epoch
// without a start does. At the same world size and K = k * batch * W, the
// epoch's batches are the uninterrupted epoch's batches k, k+1, ...
//
// It is a LibTorch sampler, so it plugs into torch::data::make_data_loader.
// The loader takes a copy; copies share their state, so set_epoch() on the
// sampler you kept steers the loader's copy:
//
//   ddp::DistributedSampler sampler(train.size().value(), *pg);
//   auto loader = torch::data::make_data_loader(train, sampler, torch::data::DataLoaderOptions(128));
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (auto& batch : *loader) ...
//   }
//
// Why not LibTorch's DistributedRandomSampler: it shuffles by epoch alone
// (no seed) with std::shuffle (whose order differs between standard
// libraries, and from PyTorch), gives each rank a contiguous block rather
// than a strided shard, has no drop_last, and its no-duplicates mode drops
// the remainder, which evaluation must count. We keep its interface
// (torch::data::samplers::Sampler<>) so LibTorch's DataLoader works as is.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {

class ProcessGroup;
struct GroupPosition;

struct DistributedSamplerOptions {
  TORCH_ARG(bool, shuffle) = true;
  TORCH_ARG(uint64_t, seed) = 0;
  // Drop the tail so every rank gets floor(N / W) samples (PyTorch's drop_last).
  TORCH_ARG(bool, drop_last) = false;
  // Without drop_last: repeat indices so every rank gets ceil(N / W). Off for
  // evaluation, where a sample counted twice would bias the result.
  TORCH_ARG(bool, pad) = true;
};

class DistributedSampler : public torch::data::samplers::Sampler<> {
 public:
  DistributedSampler(size_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});
  DistributedSampler(size_t dataset_size, const ProcessGroup& pg, DistributedSamplerOptions options = {});

  // The epoch decides the shuffle; shared with every copy of this sampler.
  // Also sets the start back to 0: a new epoch starts at its beginning.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // Positions of this epoch's permutation already taken by all ranks
  // together (an epoch resumed from a mid-epoch checkpoint, possibly written
  // at another world size): the epoch hands out the rest, from position
  // `positions_taken` on. Shared with every copy, like the epoch; set_epoch()
  // resets it to 0, so call it after set_epoch(). UsageError beyond the
  // dataset's size.
  void set_start(size_t positions_taken);
  size_t start() const;
  size_t dataset_size() const;
  // A group that re-formed at another size (ddp/comm/recovery.h): this
  // rank's shard from now on, shared with every copy, like the epoch. Then
  // set_epoch() and set_start() to where the ranks stand. UsageError for a
  // rank not in [0, num_replicas).
  // A sampler made on a recoverable group follows it by itself: reset()
  // (a loader's next pass) takes the group's new rank and size when it
  // re-formed or grew since, keeping the epoch and the start.
  void set_replicas(int num_replicas, int rank);

  // This rank's indices for the current epoch, in order.
  std::vector<size_t> indices() const;
  // How many this rank gets per epoch, and all ranks together (with padding),
  // from the start on: of R = dataset_size() - start() positions, ceil(R / W)
  // each with padding, floor(R / W) with drop_last.
  size_t num_samples() const;
  size_t total_size() const;
  int rank() const { return state_->rank; }
  int num_replicas() const { return state_->num_replicas; }

  // torch::data::samplers::Sampler<>: reset() recomputes the epoch's indices
  // (a new size, if given, replaces the dataset size); next() hands them out.
  void reset(c10::optional<size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct State {
    size_t dataset_size = 0;
    int64_t epoch = 0;
    size_t start = 0;
    int num_replicas = 1, rank = 0;
    std::shared_ptr<const GroupPosition> group;  // the recoverable group followed, if any
    int generation = 0;                          // the group's, when rank and num_replicas were set
  };
  std::shared_ptr<State> state_;  // shared between copies (see above)
  DistributedSamplerOptions options_;
  std::vector<size_t> current_;  // this copy's indices for the epoch being iterated
  size_t position_ = 0;
};

}  // namespace ddp
