// The library's errors: one family, so a program can catch ddp::Error for
// everything libddp reports, or one kind to handle it differently. Every
// message says what happened, on which rank (when a rank is known), and what
// to do. TORCH_CHECK and c10::Error remain for internal invariants only: one
// of those is a bug in libddp, not in the program using it.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// Everything libddp throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The program asked for something that cannot work: an invalid option
// (bucket_cap_mb(0), an unknown backend), a bad command line, a model that
// DistributedDataParallel cannot wrap or that differs across ranks. Thrown
// where the value is made, before any collective when it can be.
// guarded_main() exits with status 2 for it.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A missing, malformed or inconsistent launch variable (RANK, WORLD_SIZE,
// MASTER_PORT, SLURM_*, OMPI_*, a Slurm host list).
class LaunchEnvError : public Error {
 public:
  using Error::Error;
};

// A collective, the rendezvous store or a backend's connection failed or
// timed out; the message names the rank, the operation and the backend.
class CommError : public Error {
 public:
  using Error::Error;
};

// ddp::Join with throw_on_early_termination: a rank ran out of inputs, and
// every rank stops (ddp/parallel/join.h). As PyTorch's RuntimeError there.
class UnevenInputsError : public Error {
 public:
  using Error::Error;
};

// A missing, unreadable or malformed data file; the message names the file,
// what is wrong with it and what to do.
class DataError : public Error {
 public:
  using Error::Error;
};

// A checkpoint or state-dict file that is not what it should be (truncated,
// foreign, corrupt, from another model), or one that could not be written.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The program stopped on purpose for a batch system's preemption warning
// (Slurm's `--signal=USR1@T`, `scancel --signal=USR1`) after saving what it
// needs to resume (ddp/train/preemption.h). guarded_main() exits with
// kPreemptedExitCode for it, the status the job templates in deploy/slurm/
// requeue on.
class Preempted : public Error {
 public:
  using Error::Error;
};

// The training loss became NaN or infinite on some rank (the training kit's
// train_epoch, unless --nonfinite-loss continue). Every rank throws it at the
// same step, before a checkpoint of the diverged model can be written; the
// message names the first rank and step and the last good checkpoint.
class NonFiniteLoss : public Error {
 public:
  using Error::Error;
};

// EX_TEMPFAIL of sysexits.h: "a temporary failure; try again later".
constexpr int kPreemptedExitCode = 75;

}  // namespace ddp
