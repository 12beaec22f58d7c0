// The data layer across real ranks over Gloo: evaluation reduction and checkpoints.
#include <gtest/gtest.h>

#include <filesystem>

#include "../core/multiprocess.h"
#include "idx_fixture.h"

using ddp::testing::describe;
using ddp::testing::run_ranks;

TEST(Evaluation, ShardedAndReducedEqualsSingleProcess) {
  for (int world : {2, 3}) {
    auto results = run_ranks(world, DDP_DATA_WORKER, {"eval"});
    for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  }
}

TEST(Checkpoint, RankZeroWritesEveryRankRestoresAndFailuresReachEveryRank) {
  const auto dir = ddp::testing::temp_dir("ckpt_mp");
  auto results = run_ranks(2, DDP_DATA_WORKER, {"checkpoint"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoint.pt"));
  std::filesystem::remove_all(dir);
}
