#include "slurm_step.h"

#include <algorithm>
#include <string>

#include "errors.h"
#include "runtime/parse_number.h"

namespace ddprun {

void check_one_ddprun_per_node(const ddp::LaunchEnv::Lookup& lookup) {
  const std::string step = ddp::slurm_job_id(lookup);
  if (step.empty() || (!lookup("SLURM_STEP_ID") && !lookup("SLURM_STEPID"))) return;
  int count = 1;
  std::string why;
  try {
    if (auto here = ddp::slurm_tasks_on_node(lookup)) {
      count = here->count;
      why = here->from + "=" + lookup(here->from).value_or("");
    }
  } catch (const ddp::LaunchEnvError& e) {
    throw UsageError(std::string(e.what()) + "; ddprun reads it to check that it runs once per node");
  }
  // A second task on this node knows it is one even where the counts are missing.
  if (auto local = lookup("SLURM_LOCALID")) {
    auto id = ddp::parse_integer(*local, 0, 1 << 30);
    if (id && *id > 0 && *id + 1 > count) {
      count = static_cast<int>(*id) + 1;
      why = "SLURM_LOCALID=" + *local;
    }
  }
  if (count <= 1) return;
  std::string node = lookup("SLURM_NODEID").value_or("0");
  if (auto host = lookup("SLURMD_NODENAME")) node += " (" + *host + ")";
  throw UsageError("Slurm step " + step.substr(step.find(':') + 1) + " runs " + std::to_string(count) +
                   " tasks on node " + node + " (" + why + "), so " + std::to_string(count) +
                   " ddpruns would each start their own workers there; ddprun starts the workers of a node "
                   "itself: run one per node (srun --ntasks-per-node=1 ddprun ...), or start one task per GPU "
                   "with srun without ddprun (srun --ntasks-per-node=<GPUs> ./train ...)");
}

}  // namespace ddprun
