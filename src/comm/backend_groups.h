// The job's group on another backend than the default group's, behind
// dist::new_group(ranks, timeout, backend): a gloo group beside an nccl
// default one (PyTorch's common pattern for CPU-side metadata), an mpi
// group beside a gloo one, a gloo group beside an mpi one. Made once per
// backend, by every rank of the job, and shut down with the default group.
// Private to the core.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddp/comm/process_group.h"

namespace ddp::detail {

// Collective over the job: every rank of the default group calls it, in
// the same order as its other new_group calls. `backend` is "gloo", "nccl"
// or "mpi", not the default group's.
std::shared_ptr<ProcessGroup> job_group_of_backend(const std::string& backend, std::chrono::milliseconds timeout);

}  // namespace ddp::detail
