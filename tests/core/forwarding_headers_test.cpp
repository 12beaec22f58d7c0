// The flat header paths of before the folders (issue 28) still compile and
// name the same types: existing users' includes keep working until 1.0.
#include "ddp/autocast.h"
#include "ddp/comm_hook.h"
#include "ddp/ddp_options.h"
#include "ddp/default_hooks.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/grad_scaler.h"
#include "ddp/hostlist.h"
#include "ddp/join.h"
#include "ddp/launch_env.h"
#include "ddp/logging_data.h"
#include "ddp/main_guard.h"
#include "ddp/malloc_tuning.h"
#include "ddp/object_collectives.h"
#include "ddp/powersgd_hook.h"
#include "ddp/process_group.h"
#include "ddp/reducer.h"
#include "ddp/sync_batch_norm.h"
#include "ddp/timeline.h"
#include "ddp/zero_redundancy_optimizer.h"

#include <gtest/gtest.h>

#include <type_traits>

#include "ddp/ddp.h"

namespace {

TEST(ForwardingHeaders, OldPathsNameTheTypesOfTheNewOnes) {
  // Each old path reaches the declarations of its new one; a few types stand
  // for all (every header is included above).
  static_assert(std::is_class_v<ddp::DistributedDataParallelBase>);
  static_assert(std::is_class_v<ddp::DDPOptions>);
  static_assert(std::is_class_v<ddp::Reducer>);
  static_assert(std::is_class_v<ddp::ProcessGroup>);
  static_assert(std::is_class_v<ddp::Timeline>);
  static_assert(std::is_class_v<ddp::ZeroRedundancyOptimizer>);
  static_assert(std::is_class_v<ddp::GradScaler>);
  static_assert(std::is_class_v<ddp::LaunchEnv>);
  SUCCEED();
}

}  // namespace
