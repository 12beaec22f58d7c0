// The training kit's TensorBoard records of a run (RunDir's writer): what
// each epoch's end, the steps the progress bar reads the loss at, and the
// run's end write, and under which tags (docs/training.md lists them).
#pragma once

#include <cstdint>

#include "ddp/amp/grad_scaler.h"
#include "ddp/train/run_dir.h"

namespace ddp::detail {

// At an epoch's end, step: the run's optimizer steps so far. The figures of
// metrics.csv, the learning rate, the loss scale of an enabled scaler, the
// DDP statistics the last ddp::optimizer_step noted; then a flush.
void write_epoch_records(RunDir& run, const EpochMetrics& m, int64_t step, double lr, const GradScaler* scaler);
// Inside an epoch, where the loss is read anyway: the step's loss and the
// mean step time since the last such point.
void write_step_records(RunDir& run, int64_t step, double loss, double step_ms);
// A RunDir going away: optimizer_step's statistics no longer go to it.
void forget_open_run(const RunDir* run);

}  // namespace ddp::detail
