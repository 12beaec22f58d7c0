// The distributed core, everything in one include: the launch environment,
// the process group and its collectives, DistributedDataParallel and its
// reducer, SyncBatchNorm, the distributed sampler. Needs LibTorch only. The training kit
// (datasets, checkpoints, run folders, options) is <ddp/train.h>.
#pragma once

#include "ddp/autocast.h"
#include "ddp/comm_hook.h"
#include "ddp/ddp_options.h"
#include "ddp/default_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/errors.h"
#include "ddp/grad_scaler.h"
#include "ddp/hostlist.h"
#include "ddp/join.h"
#include "ddp/launch_env.h"
#include "ddp/main_guard.h"
#include "ddp/malloc_tuning.h"
#include "ddp/object_collectives.h"
#include "ddp/powersgd_hook.h"
#include "ddp/process_group.h"
#include "ddp/reducer.h"
#include "ddp/sync_batch_norm.h"
#include "ddp/timeline.h"
#include "ddp/zero_redundancy_optimizer.h"
