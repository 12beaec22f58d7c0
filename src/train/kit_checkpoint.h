// Where the training kit keeps a run's checkpoints, and in which layout: the
// folder <run>/checkpoint/ that every rank writes its part into (sharded),
// when every rank sees the run folder (one shared file system) and the
// optimizer is one a sharded checkpoint takes apart; else the one file
// <run>/checkpoint.pt that rank 0 writes. A resume takes whichever of the
// two was written last. Private: resume.cpp, epoch_loop.cpp, epoch_run.cpp
// and train_options.cpp.
#pragma once

#include <torch/torch.h>

#include <string>

#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/run_dir.h"

namespace ddp::detail {

// Collective: the layout the kit writes `run`'s checkpoints in, logged to
// the run with the reason. Whether every rank sees the run folder as rank
// 0's: rank 0 leaves a file of a random name there, every rank looks for it
// (a rank on a node-local folder of the same name does not see it).
CheckpointLayout kit_layout(RunDir& run, const torch::optim::Optimizer& optimizer, ProcessGroup& pg);

// Where the kit's saves go: <run>/checkpoint for a sharded writer, else
// <run>/checkpoint.pt (no writer: under in-process recovery).
std::string kit_checkpoint_path(const RunDir& run, const TrainState& state);

// Not collective, what this process sees: of <folder>/checkpoint.pt (or its
// .prev.pt) and the sharded <folder>/checkpoint (its manifest, or the
// previous one), the one written last; "" when there is neither.
std::string newest_checkpoint(const std::string& folder);

}  // namespace ddp::detail
