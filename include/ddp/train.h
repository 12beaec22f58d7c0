// The training kit on top of the core, everything in one include: datasets
// (Fashion-MNIST, CSV series, tensors), evaluation, checkpoints and state
// dicts, run folders with metrics and charts, progress, the environment
// table, TensorBoard event files, the examples' command line and their epoch
// loop. Needs the core (<ddp/ddp.h>, included here), Boost.ProgramOptions,
// zlib and protobuf.
#pragma once

#include "ddp/ddp.h"

#include "ddp/data/csv_series.h"
#include "ddp/data/fashion_mnist.h"
#include "ddp/data/tensor_dataset.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/env_summary.h"
#include "ddp/train/errors.h"
#include "ddp/train/epoch_loop.h"
#include "ddp/train/evaluation.h"
#include "ddp/train/preemption.h"
#include "ddp/train/progress.h"
#include "ddp/train/run_dir.h"
#include "ddp/train/state_dict.h"
#include "ddp/train/summary_writer.h"
#include "ddp/train/train_options.h"
