// Connecting a backend: the one sequence by which init_process_group makes
// the default group and new_group makes a group of another backend beside
// it. The backend's name is read once (parse_backend_name); NCCL takes the
// rank's GPU, mpi needs Open MPI's mpirun, gloo and nccl meet on the job's
// store (a fresh one, or the default group's under a prefix of its own).
// Private to the core.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddp/comm/process_group.h"
#include "ddp/runtime/launch_env.h"

namespace ddp::detail {

// "gloo", "nccl" or "mpi" from a name as PyTorch takes it (any case), or
// "auto" where `auto_allowed`; else a UsageError prefixed with `who`.
std::string parse_backend_name(const std::string& name, bool auto_allowed, const std::string& who);

// "auto" made concrete: nccl where a GPU is visible, else gloo.
std::string resolve_backend(const std::string& parsed);

struct BackendRequest {
  std::string backend;  // gloo, nccl or mpi
  std::string asked;    // what the program named (auto too), for the GPU choice's errors
  LaunchEnv env;        // init_method applied
  std::chrono::milliseconds timeout;
  int generation = 0;   // the store prefix's (GroupRegistry::next_generation)
  std::string who;      // starts every error
  // The default group, for a group beside it: its store is reused (under a
  // prefix of the new group's), where it has one.
  const ProcessGroup* beside = nullptr;
  // A store to meet on instead (under the generation's prefix): a
  // recoverable group's, on the launcher's store.
  std::shared_ptr<StoreHandle> store;
};

// Collective over the job: every rank calls it with the same backend.
std::shared_ptr<ProcessGroup> connect_backend(BackendRequest request);

}  // namespace ddp::detail
