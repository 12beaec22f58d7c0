// Which GPU a rank of an NCCL group uses, and the refusal, on every rank and
// before any NCCL call, of more ranks on a node than it has GPUs (NCCL would
// fail later with "Duplicate GPU detected" deep in a c10d stack). Private to
// the core; Torch-free, so tests give it any count.
#pragma once

#include <string>

#include "ddp/runtime/launch_env.h"

namespace ddp::detail {

// The GPU of this rank: its LOCAL_RANK. `gpus` is the count this process
// sees (CUDA_VISIBLE_DEVICES applied). A UsageError, prefixed with `who`,
// where the node's ranks outnumber its GPUs or this rank's LOCAL_RANK has
// none; `backend_asked` ("nccl" or "auto") says how NCCL was chosen. Under
// Slurm or mpirun with CUDA_VISIBLE_DEVICES set, a rank that sees fewer
// GPUs than the node has ranks was given its own by the launcher (Slurm's
// --gpus-per-task): it takes GPU LOCAL_RANK modulo the count.
int gpu_of_rank(const LaunchEnv& env, int gpus, const std::string& backend_asked, const std::string& who);

}  // namespace ddp::detail
