// The environment summary a run prints once, on rank 0: versions, the world,
// and a table of ranks with host, process, backend, device and, where there
// are GPUs, each rank's GPU name and memory (the seeds print this by hand);
// in builds with the mpi backend, the MPI library's version too.
//
//   rank  local  host     pid    backend  device  gpu                    memory
//   0     0      node01   4242   nccl     cuda:0  NVIDIA H100 80GB HBM3  79.1 GiB
#pragma once

#include <string>

#include "ddp/comm/process_group.h"

namespace ddp {

// Collective (one allgather). Returns the table on rank 0 and "" elsewhere.
std::string environment_summary(ProcessGroup& pg);

}  // namespace ddp
