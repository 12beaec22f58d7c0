// A running group's state as bytes, for a rank that joins it under
// in-process recovery (ddp/comm/recovery.h): what a checkpoint holds (the
// model, the optimizer, the position, the loss scaler, the sender's random
// stream), handed over the group instead of through a file. Private.
#pragma once

#include <torch/torch.h>

#include <string>

#include "ddp/amp/grad_scaler.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"

namespace ddp::detail {

// The state of this rank: state.model and state.optimizer (resume_or_start
// sets them), the position in `state`.
std::string live_state_bytes(const TrainState& state, const ProcessGroup& pg);

// The state of this rank written alone as a checkpoint at `path` (no
// collective: the group is gone), as save_checkpoint would with one rank:
// this rank's random stream stands for every rank's.
void save_checkpoint_alone(const std::string& path, const TrainState& state);

// The state received: loaded into the model, the optimizer and the scaler;
// the position returned.
TrainState load_live_state(const std::string& bytes, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                           ProcessGroup& pg, GradScaler* scaler);

}  // namespace ddp::detail
