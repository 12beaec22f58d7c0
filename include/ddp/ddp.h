// The distributed core, everything in one include: the launch environment,
// the process group and its collectives, DistributedDataParallel and its
// reducer, SyncBatchNorm, the distributed sampler. Needs LibTorch only. The training kit
// (datasets, checkpoints, run folders, options) is <ddp/train.h>.
#pragma once

#include "ddp/errors.h"

// comm/: process groups and collectives
#include "ddp/comm/dist.h"
#include "ddp/comm/object_collectives.h"
#include "ddp/comm/process_group.h"
#include "ddp/comm/recovery.h"

// parallel/: DistributedDataParallel, its reducer, hooks, Join, the sampler
#include "ddp/parallel/comm_hook.h"
#include "ddp/parallel/ddp_options.h"
#include "ddp/parallel/default_hooks.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/parallel/distributed_sampler.h"
#include "ddp/parallel/join.h"
#include "ddp/parallel/post_local_sgd_hook.h"
#include "ddp/parallel/powersgd_hook.h"
#include "ddp/parallel/reducer_stats.h"

// observe/: timeline, logging data
#include "ddp/observe/logging_data.h"
#include "ddp/observe/timeline.h"

// nn/, optim/, amp/: built on the process group
#include "ddp/amp/autocast.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/nn/sync_batch_norm.h"
#include "ddp/nn/unique_parameters.h"
#include "ddp/optim/model_averaging.h"
#include "ddp/optim/post_local_sgd_optimizer.h"
#include "ddp/optim/zero_redundancy_optimizer.h"

// runtime/: the process's start
#include "ddp/runtime/hostlist.h"
#include "ddp/runtime/launch_env.h"
#include "ddp/runtime/main_guard.h"
#include "ddp/runtime/malloc_tuning.h"
