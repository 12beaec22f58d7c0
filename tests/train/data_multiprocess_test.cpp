// The data layer across real ranks over Gloo: evaluation reduction and checkpoints.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/idx_fixture.h"
#include "../support/located.h"
#include "../support/multiprocess.h"

using ddp::testing::describe;
using ddp::testing::run_ranks;

TEST(Evaluation, ShardedAndReducedEqualsSingleProcess) {
  for (int world : {2, 3}) {
    auto results = run_ranks(world, DDP_DATA_WORKER, {"eval"});
    for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  }
}

// Per-token sums of a sequence model over 37 sequences (uneven shards):
// every rank's global means equal one process's (ddp::evaluate, MetricSums).
TEST(Evaluation, MetricSumsOverUnevenShardsGiveTheSingleProcessMeans) {
  for (int world : {2, 3}) {
    auto results = run_ranks(world, DDP_DATA_WORKER, {"metric_sums"});
    for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << world << " ranks: " << describe(results);
  }
}

TEST(Checkpoint, RankZeroWritesEveryRankRestoresAndFailuresReachEveryRank) {
  const auto dir = ddp::testing::temp_dir("ckpt_mp");
  auto results = run_ranks(2, DDP_DATA_WORKER, {"checkpoint"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoint.pt"));
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, AZeroOptimizerIsConsolidatedAndEveryRankGetsItsShareBack) {
  const auto dir = ddp::testing::temp_dir("ckpt_zero");
  for (int world : {2, 3}) {
    auto results = run_ranks(world, DDP_DATA_WORKER, {"zero_checkpoint"}, {{"DDP_TEST_DIR", dir}});
    for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << world << " ranks: " << describe(results);
  }
  std::filesystem::remove_all(dir);
}

// A NaN loss on one rank stops every rank at the same step, at a mid-epoch
// check (every 2 steps) or at the epoch's end (check every 10), before a
// checkpoint of the diverged model; --nonfinite-loss continue trains on.
TEST(NonFiniteLoss, EveryRankStopsNamingTheRankTheStepAndTheLastGoodCheckpoint) {
  struct Case {
    int world, bad_rank;
    int64_t bad_step, check_every;
    std::string mode;
  };
  for (const Case& c : {Case{2, 1, 6, 2, "stop"}, Case{2, 0, 7, 10, "stop"}, Case{3, 2, 2, 10, "stop"},
                        Case{2, 1, 6, 2, "continue"}}) {
    const auto dir = ddp::testing::temp_dir("nonfinite");
    auto results = run_ranks(c.world, DDP_DATA_WORKER,
                             {"nonfinite", std::to_string(c.bad_rank), std::to_string(c.bad_step),
                              std::to_string(c.check_every), c.mode},
                             {{"DDP_TEST_DIR", dir}});
    for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << c.mode << " step " << c.bad_step << "\n" << describe(results);
    if (c.mode == "continue")
      EXPECT_NE(results[0].output.find("training on (--nonfinite-loss continue)"), std::string::npos)
          << results[0].output;
    std::filesystem::remove_all(dir);
  }
}
