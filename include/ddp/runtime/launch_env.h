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
  enum class Source { Single, Torchrun, Slurm, OpenMPI, PMI };

  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  Source source = Source::Single;
  // The job this process belongs to, as its launcher names it: "slurm:JOB.STEP"
  // (SLURM_JOB_ID, SLURM_STEP_ID), "mpi:NAMESPACE" (Open MPI's PMIx
  // namespace), else "". Jobs sharing a node take their default MASTER_PORT
  // from it (default_port_for_job) and their rendezvous store refuses ranks
  // of another job, so two jobs can never meet.
  std::string job_id;
  // An Open MPI job across hosts without MASTER_ADDR, in a build with MPI:
  // master_addr is empty, to be learned by init_process_group over MPI
  // (rank 0's address on the subnet every rank shares with it).
  bool master_over_mpi = false;

  // Reads the process environment. Precedence (first complete set wins):
  //   1. torchrun/ddprun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  //      MASTER_ADDR, MASTER_PORT
  //   2. Slurm, inside a job step (srun): SLURM_PROCID, SLURM_NTASKS,
  //      SLURM_LOCALID; the tasks on this node from the step's
  //      SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID (else
  //      SLURM_NTASKS_PER_NODE, else the job's SLURM_TASKS_PER_NODE); master
  //      = first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST).
  //      Slurm's variables with more than one task but no step
  //      (SLURM_STEP_ID unset: a batch script that forgot srun) are an error.
  //   3. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
  //   4. MPICH and Intel MPI (PMI): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
  //      MPI_LOCALNRANKS
  //   5. none of these: a single process, rank 0 of 1.
  // MASTER_ADDR and MASTER_PORT override the master of sources 2 to 4
  // (without MASTER_PORT, a Slurm or Open MPI job's port comes from its job
  // id: default_port_for_job); MPI
  // jobs on one node default to loopback. Across nodes, Open MPI jobs in a
  // build with MPI leave the master to be learned (master_over_mpi); other
  // MPI jobs, and all of them in a build without MPI, need MASTER_ADDR (the
  // error says how to pass it).
  static LaunchEnv from_environment();

  // The same, from any lookup (tests pass a map; nullopt means unset).
  using Lookup = std::function<std::optional<std::string>(const std::string&)>;
  static LaunchEnv from_lookup(const Lookup& lookup);
  // The Lookup of this process's environment (getenv).
  static std::optional<std::string> process_environment(const std::string& name);

  // "torchrun", "slurm", "openmpi", "pmi" or "single".
  std::string source_name() const;
};

// How many tasks of the Slurm step run on this node, and the variable that
// said so: the step's SLURM_STEP_TASKS_PER_NODE (Slurm's compressed list,
// "4(x2),3") at SLURM_NODEID, else SLURM_NTASKS_PER_NODE, else the job's
// SLURM_TASKS_PER_NODE at SLURM_NODEID; nullopt when none is set (or the
// node is past the lists). LaunchEnv's local world size under Slurm, and
// how ddprun sees that srun started it more than once on a node. Throws
// LaunchEnvError for a malformed value.
struct SlurmTaskCount {
  int count = 1;
  std::string from;
};
std::optional<SlurmTaskCount> slurm_tasks_on_node(const LaunchEnv::Lookup& lookup);

// "slurm:JOB.STEP" from SLURM_JOB_ID and SLURM_STEP_ID (or SLURM_STEPID;
// "batch" outside a step), or "" outside a Slurm job: LaunchEnv::job_id
// under Slurm, and what ddprun derives its default port from.
std::string slurm_job_id(const LaunchEnv::Lookup& lookup);

// MASTER_PORT for a job that did not choose one: 29500 without a job id,
// else a port in [15000, 30000) derived from the id, so that jobs sharing a
// node pick different ports (below Linux's ephemeral range).
uint16_t default_port_for_job(const std::string& job_id);

// This process's rank as the launcher that started it says it, in the order
// of LaunchEnv's precedence (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK,
// PMI_RANK), unparsed, or "0": for labelling errors, also those about the
// launch environment itself.
std::string rank_from_environment();

}  // namespace ddp
