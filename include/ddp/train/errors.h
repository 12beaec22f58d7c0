// The training kit's errors, in libddp's family (ddp/errors.h): a program
// stopped for a preemption warning, and a loss that stopped being finite.
#pragma once

#include "ddp/errors.h"

namespace ddp {

// The program stopped on purpose for a batch system's preemption warning
// (Slurm's `--signal=USR1@T`, `scancel --signal=USR1`) after saving what it
// needs to resume (ddp/train/preemption.h). guarded_main() exits with
// kPreemptedExitCode for it, the status the job templates in deploy/slurm/
// requeue on.
class Preempted : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
  int exit_code() const noexcept override { return kPreemptedExitCode; }
};

// The training loss became NaN or infinite on some rank (the training kit's
// train_epoch, unless --nonfinite-loss continue). Every rank throws it at the
// same step, before a checkpoint of the diverged model can be written; the
// message names the first rank and step and the last good checkpoint.
class NonFiniteLoss : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

}  // namespace ddp
