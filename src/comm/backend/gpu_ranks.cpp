#include "comm/backend/gpu_ranks.h"

#include <algorithm>
#include <cstdlib>

namespace ddp::detail {

int gpu_of_rank(const LaunchEnv& env, int gpus, const std::string& backend_asked, const std::string& who) {
  const int ranks_here = std::max(env.local_world_size, env.local_rank + 1);
  if (ranks_here <= gpus) return env.local_rank;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  // Slurm (--gpus-per-task, --gpu-bind) and mpirun wrappers may give each
  // task its own CUDA_VISIBLE_DEVICES: then the GPUs a rank sees are its
  // own, not the node's, and it takes one of them. ddprun and torchrun
  // start a node's ranks with one environment, so what a rank sees there is
  // the node's GPUs, as it is wherever CUDA_VISIBLE_DEVICES is unset.
  if (gpus > 0 && visible && env.source != LaunchEnv::Source::Torchrun) return env.local_rank % gpus;
  const std::string seen = std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") +
                           (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string());
  const std::string chosen = backend_asked == "auto" ? "the auto backend chose nccl, which" : "the nccl backend";
  throw UsageError(who + chosen + " needs a GPU of its own for each rank, and this node has " +
                   std::to_string(ranks_here) + " ranks (LOCAL_RANK " + std::to_string(env.local_rank) + " of " +
                   std::to_string(ranks_here) + ", from " + env.source_name() + ") for the " + seen +
                   " this process sees. Either start one rank per GPU (ddprun --nproc-per-node gpu; under Slurm or "
                   "mpirun, as many tasks per node as GPUs), or choose the gloo backend to run several ranks on one GPU "
                   "(--backend gloo in the kit's programs, ProcessGroupOptions().backend(\"gloo\") in your own)");
}

}  // namespace ddp::detail
