// The data layer across real ranks over Gloo: evaluation reduction and checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

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

TEST(Checkpoint, WrittenInTheBackgroundItIsTheSameFileAndAFailureReachesEveryRank) {
  const auto dir = ddp::testing::temp_dir("ckpt_async");
  auto results = run_ranks(2, DDP_DATA_WORKER, {"async_checkpoint"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  std::filesystem::remove_all(dir);
}

// SIGKILL at random moments of the background writes: every time, the next
// start loads a whole checkpoint (the newest, or the one before it).
class KilledWhileWriting : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledWhileWriting, InTheBackgroundALoadableCheckpointIsLeft) {
  const auto dir = ddp::testing::temp_dir("ckpt_async_kill");
  std::mt19937 random(7);
  size_t saves_before = 0;
  for (int kill = 0; kill < 3; ++kill) {
    const std::map<std::string, std::string> env{{"DDP_TEST_DIR", dir}, {"RANK", "0"}, {"WORLD_SIZE", "1"},
                                                 {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(ddp::testing::free_port())},
                                                 {"OMP_NUM_THREADS", "1"}, {"CHECKPOINT_LAYOUT", GetParam()}};
    const pid_t pid = ddp::testing::spawn(DDP_DATA_WORKER, {"async_checkpoint_loop", "1000"}, env,
                                          dir + "/out" + std::to_string(kill) + ".log");
    // A few saves in, then a moment anywhere in the next ones.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto saves = [&] {
      std::ifstream in(dir + "/saves");
      return static_cast<size_t>(std::count(std::istreambuf_iterator<char>(in), {}, '\n'));
    };
    while (saves() < saves_before + 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 40)(random)));
    ::kill(-pid, SIGKILL);
    EXPECT_EQ(ddp::testing::wait_exit_code(pid, until, [] {}), 128 + SIGKILL);
    saves_before = saves();
    ASSERT_GE(saves_before, 2u) << ddp::testing::read_file(dir + "/out" + std::to_string(kill) + ".log");
  }
  auto check = run_ranks(1, DDP_DATA_WORKER, {"async_checkpoint_loop", "1"},
                         {{"DDP_TEST_DIR", dir}, {"CHECKPOINT_LAYOUT", GetParam()}});
  ASSERT_EQ(check[0].exit_code, 0) << describe(check);
  EXPECT_NE(check[0].output.find("loaded step "), std::string::npos) << describe(check);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, KilledWhileWriting, ::testing::Values("file", "sharded"),
                         [](const auto& info) { return info.param; });

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
