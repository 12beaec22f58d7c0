// Preemption: a batch system's warning signal, or a launcher's stop request,
// becomes a checkpoint and a clean exit that the job script requeues on
// (deploy/slurm/, docs/clusters.md) or the launcher restarts from.
//
// Slurm sends SIGUSR1 some time before it stops a job (`#SBATCH
// --signal=USR1@120`, or `scancel --signal=USR1 JOB` by hand or by a
// preemption policy); ddprun forwards it to its workers. SIGTERM is how
// ddprun and torchrun stop the workers when the node set of an elastic job
// changes (a node joins or leaves; SIGKILL follows after --term-timeout),
// and how Slurm ends a job. resume_or_start() watches both while
// --preemption-check-every is above 0. The signal reaches the ranks at
// slightly different steps, so a rank cannot act on it alone: every
// --preemption-check-every steps, train_epoch() asks all ranks at once (one
// all-reduce sized by the world, so any world size works), and when any rank
// got it, every rank stops at the same step, rank 0 writes a checkpoint that
// records the position inside the epoch (samples taken by all ranks, so a
// restart at another world size goes on from there), and ddp::Preempted is
// thrown, which guarded_main() turns into exit status 75. The requeued or
// restarted job resumes from that checkpoint by itself (resume_or_start:
// restart_reason()).
//
// A watched signal outside train_epoch (evaluation, the end of an epoch) is
// acted on at the next epoch's first step; after the last epoch the program
// finishes normally (saving the model and charts takes seconds). A program
// with its own loop that calls resume_or_start() should call
// preemption_requested() now and then, or pass --preemption-check-every 0
// (then SIGTERM keeps its default action and ends the process at once).
#pragma once

#include <csignal>

#include "ddp/comm/process_group.h"
#include "ddp/train/errors.h"

namespace ddp {

// Installs (once per signal) a handler that only records that `signo`
// arrived; the default action (termination) no longer happens for it: the
// program must look (preemption_requested) and end itself.
void watch_preemption_signal(int signo = SIGUSR1);

// The watched signal that arrived in this process, 0 if none has.
int preemption_signal_received();

// Collective: true on every rank when any rank received a watched signal.
bool preemption_requested(ProcessGroup& pg);

// Forgets a received signal (tests, and programs that handled it).
void clear_preemption_signal();

}  // namespace ddp
