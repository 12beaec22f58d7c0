// The checkpoint file's pieces that save_checkpoint and the background
// CheckpointWriter share: the parts a checkpoint holds, their pickled bytes,
// the atomic write with its rotation, and rank 0's verdict.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/train/checkpoint.h"
#include "torch_pickle.h"

namespace ddp::detail {

struct CheckpointParts {
  StateDict model;
  // The optimizer's archive as bytes, or still to be serialized (off the
  // training thread) from an archive over staged copies.
  std::string optimizer;
  std::shared_ptr<torch::serialize::OutputArchive> optimizer_archive;
  TrainState position;  // its saved fields
  std::optional<GradScalerState> scaler;
  int world_size = 1;
  std::vector<at::Tensor> rng;  // every rank's CPU generator
};

std::vector<char> pickle_checkpoint(const CheckpointParts& parts);
// What every checkpoint file and a sharded checkpoint's manifest hold
// besides the model and the optimizer: `format`, the version, where the run
// is, every rank's generator, the config, the extras and the scaler.
c10::impl::GenericDict common_entries(const CheckpointParts& parts, const std::string& format);

// Those entries read back from `root` (`used` names the file), each checked:
// where the run is and its config;
TrainState read_position(const pickle::ValuePtr& root, const std::string& used);
// the scaler's state (none: a checkpoint written without float16), and
// into an enabled scaler (a notice when there is none);
std::optional<GradScalerState> read_scaler(const pickle::ValuePtr& root, const std::string& used);
void load_scaler(const pickle::ValuePtr& root, const std::string& used, GradScaler& scaler, const ProcessGroup& pg);
// this rank's generator; with another world size, the old ranks' round-robin.
void load_rng_state(const pickle::ValuePtr& root, const std::string& used, int world_size, const ProcessGroup& pg);

// Writes `bytes` as the checkpoint `path`: a temporary file, synced and read
// back whole, then the rotation (the old file becomes <name>.prev.pt if it
// is whole) and the rename. A failure leaves both files as they were.
void write_checkpoint_file(const std::string& path, const std::vector<char>& bytes);

torch::Tensor cpu_rng_state();

// Rank 0 says whether its part succeeded; the others learn it (and wait for
// it): CheckpointError on them when it failed.
void share_verdict(ProcessGroup& pg, bool ok, const std::string& what);

}  // namespace ddp::detail
