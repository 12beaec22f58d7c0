// The training kit's side of in-process recovery (ddp/comm/recovery.h), for
// what train_epoch does not cover by itself: which errors are a peer's fault
// (the group re-forms) and which the program's own (they end it); the group
// re-formed; and, when too few ranks remain, the work kept: a checkpoint of
// the last committed step, written by one survivor, then exit 75. Private
// to src/train/.
#pragma once

#include <cstdint>

#include "ddp/comm/process_group.h"
#include "ddp/comm/recovery.h"
#include "ddp/train/checkpoint.h"

namespace ddp::detail {

// Inside a catch: whether the error being handled is a peer's fault (a
// failed collective, a step that did not commit), said on stderr with
// `what` ("step 12", "the evaluation") and the error's first line. The
// program's own errors (UsageError, DataError, CheckpointError, Preempted,
// NonFiniteLoss) are not. TooFewRanks: the state saved and Preempted thrown,
// as reform_or_stop.
bool peer_fault(const ProcessGroup& pg, const std::string& what);

// group.reform(); where too few ranks remain (TooFewRanks): the state
// track_live_state() was last given, saved by the first survivor as the
// run's checkpoint, and Preempted (exit 75) on every survivor, naming it.
void reform_or_stop(RecoverableGroup& group);

// The TrainState of the running loop (train_epoch's and end_epoch's): what
// reform_or_stop saves. Not owned: finish_run() forgets it.
void track_live_state(TrainState& state);
void forget_live_state();

// An epoch's steps all taken (EpochRun::finish, before its counts reset):
// the position a checkpoint written before end_epoch() resumes at, where
// only the evaluation and the epoch's end are left. end_epoch() forgets it.
void note_epoch_trained(int64_t epoch, int64_t epoch_step, int64_t epoch_samples);
void forget_epoch_trained();

}  // namespace ddp::detail
