// The mpi backend: our own ddp::ProcessGroup on MPI's non-blocking
// collectives (LibTorch is not built with c10d's ProcessGroupMPI), and the
// discovery of rank 0's address over MPI for multi-node mpirun jobs without
// MASTER_ADDR. Compiled only when CMake finds MPI (DDP_WITH_MPI).
#pragma once

#ifdef DDP_WITH_MPI

#include <chrono>
#include <memory>
#include <string>

#include "ddp/runtime/launch_env.h"
#include "ddp/comm/process_group.h"
#include "comm/backend/interfaces.h"

namespace ddp::detail {

// Initializes MPI if nobody has (MPI_THREAD_MULTIPLE asked, SERIALIZED
// accepted: every MPI call of libddp holds one mutex; MPI_Finalize at exit
// only then), checks that MPI's rank and size are the launch environment's,
// and builds the group on a duplicate of MPI_COMM_WORLD. `who` prefixes errors.
std::shared_ptr<ProcessGroup> make_mpi_process_group(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                                     torch::Device device, const std::string& who);

// Every rank's up, non-loopback IPv4 interfaces, all-gathered over MPI, and
// the subnet that joins every rank to rank 0 (choose_master_route).
MasterRoute learn_master_route_over_mpi(std::chrono::milliseconds timeout, const std::string& who);

// MPI_Get_library_version's text, first line.
std::string mpi_library_version_text();

}  // namespace ddp::detail

#endif  // DDP_WITH_MPI
