// The checkpoint file's pieces that save_checkpoint and the background
// CheckpointWriter share: the parts a checkpoint holds, their pickled bytes,
// the atomic write with its rotation, and rank 0's verdict.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/train/checkpoint.h"

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

// Writes `bytes` as the checkpoint `path`: a temporary file, synced and read
// back whole, then the rotation (the old file becomes <name>.prev.pt if it
// is whole) and the rename. A failure leaves both files as they were.
void write_checkpoint_file(const std::string& path, const std::vector<char>& bytes);

torch::Tensor cpu_rng_state();

// Rank 0 says whether its part succeeded; the others learn it (and wait for
// it): CheckpointError on them when it failed.
void share_verdict(ProcessGroup& pg, bool ok, const std::string& what);

}  // namespace ddp::detail
