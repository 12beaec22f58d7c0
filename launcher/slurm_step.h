// ddprun under srun: one ddprun per node of a step. Two ddpruns of one step
// on one node would each start a whole worker group for the same node rank
// and port, and hang in rendezvous or run two jobs into one run; so every
// ddprun of such a step refuses at once, saying how to start it instead.
#pragma once

#include "ddp/runtime/launch_env.h"

namespace ddprun {

// Throws UsageError when `lookup` (ddprun's environment) says this process
// is one of several tasks of one Slurm step on this node: a step
// (SLURM_JOB_ID and SLURM_STEP_ID or SLURM_STEPID set) whose task count on
// this node (ddp::slurm_tasks_on_node) is above 1, or a task with
// SLURM_LOCALID above 0. Anything else, including no Slurm at all, passes.
void check_one_ddprun_per_node(const ddp::LaunchEnv::Lookup& lookup);

}  // namespace ddprun
