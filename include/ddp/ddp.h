// Everything a training program needs from libddp.
#pragma once

#include "ddp/ddp_options.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/launch_env.h"
#include "ddp/process_group.h"
#include "ddp/reducer.h"
