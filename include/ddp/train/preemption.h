// Preemption: a batch system's warning signal becomes a checkpoint and a
// clean exit that the job script requeues on (deploy/slurm/, docs/clusters.md).
//
// Slurm sends SIGUSR1 some time before it stops a job (`#SBATCH
// --signal=USR1@120`, or `scancel --signal=USR1 JOB` by hand or by a
// preemption policy); ddprun forwards it to its workers. The signal reaches
// the ranks at slightly different steps, so a rank cannot act on it alone:
// every --preemption-check-every steps, train_epoch() asks all ranks at once
// (preemption_requested, one all-reduce of one number), and when any rank got
// it, every rank stops at the same step, rank 0 writes a checkpoint that
// records the position inside the epoch, and ddp::Preempted is thrown, which
// guarded_main() turns into exit status 75. The requeued job resumes from
// that checkpoint by itself (resume_or_start: SLURM_RESTART_COUNT or
// TORCHELASTIC_RESTART_COUNT above 0) and skips the batches already taken.
#pragma once

#include <csignal>

#include "ddp/comm/process_group.h"

namespace ddp {

// Installs (once per signal) a handler that only records that `signo`
// arrived; the default action (termination) no longer happens for it.
void watch_preemption_signal(int signo = SIGUSR1);

// The watched signal that arrived in this process, 0 if none has.
int preemption_signal_received();

// Collective: true on every rank when any rank received a watched signal.
bool preemption_requested(ProcessGroup& pg);

// Forgets a received signal (tests, and programs that handled it).
void clear_preemption_signal();

}  // namespace ddp
