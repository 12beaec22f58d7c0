// Everything a training program needs from libddp.
#pragma once

#include "ddp/ddp_options.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/launch_env.h"
#include "ddp/malloc_tuning.h"
#include "ddp/process_group.h"
#include "ddp/reducer.h"

// Training on real data.
#include "ddp/checkpoint.h"
#include "ddp/csv_series.h"
#include "ddp/distributed_sampler.h"
#include "ddp/env_summary.h"
#include "ddp/evaluation.h"
#include "ddp/fashion_mnist.h"
#include "ddp/main_guard.h"
#include "ddp/progress.h"
#include "ddp/run_dir.h"
#include "ddp/state_dict.h"
#include "ddp/tensor_dataset.h"
#include "ddp/train_options.h"
