// The launch environment: who this worker is (rank, world size, local rank)
// and where the rendezvous master lives, read from the variables that
// ddprun/torchrun, Slurm or Open MPI set. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ddp/errors.h"

namespace ddp {

struct LaunchEnv {
  enum class Source { Single, Torchrun, Slurm, OpenMPI };

  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  Source source = Source::Single;

  // Reads the process environment. Precedence (first complete set wins):
  //   1. torchrun/ddprun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  //      MASTER_ADDR, MASTER_PORT
  //   2. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
  //      SLURM_NTASKS_PER_NODE (else SLURM_TASKS_PER_NODE's first count),
  //      master = first host of SLURM_JOB_NODELIST
  //   3. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
  //   4. none of these: a single process, rank 0 of 1.
  // MASTER_ADDR and MASTER_PORT override the master of sources 2 and 3.
  static LaunchEnv from_environment();

  // The same, from any lookup (tests pass a map; nullopt means unset).
  using Lookup = std::function<std::optional<std::string>(const std::string&)>;
  static LaunchEnv from_lookup(const Lookup& lookup);

  // "torchrun", "slurm", "openmpi" or "single".
  std::string source_name() const;
};

}  // namespace ddp
