// An elastic job that changes its world size: stopped mid-epoch at 2 ranks
// (a preemption warning, or ddprun's SIGTERM when a node joins or leaves),
// restarted at 3 from the run folder's checkpoint. The data position is
// global, so across the change every sample of the epoch is trained on
// exactly once, plus exactly the padding of the resumed shards.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "../support/idx_fixture.h"
#include "../support/located.h"
#include "../support/multiprocess.h"
#include "ddp/parallel/distributed_sampler.h"
#include "ddp/train/preemption.h"

using ddp::testing::describe;
using ddp::testing::run_ranks;

namespace {

constexpr size_t kSamples = 50;  // elastic_worker.cpp's data set

// epoch -> index -> how often the files `<run>/indices.<tag>.<rank>` saw it.
using Counts = std::map<int64_t, std::map<size_t, int>>;

void add_counts(Counts& counts, const std::string& run, const std::string& tag, int world) {
  for (int r = 0; r < world; ++r) {
    std::ifstream in(run + "/indices." + tag + "." + std::to_string(r));
    int64_t epoch;
    size_t index;
    while (in >> epoch >> index) ++counts[epoch][index];
  }
}

// Positions [from, to) of epoch `epoch`'s permutation (beyond kSamples: the
// padding, from the permutation's start again).
void add_positions(std::map<size_t, int>& counts, int64_t epoch, size_t from, size_t to) {
  ddp::DistributedSampler one(kSamples, 1, 0);
  one.set_epoch(epoch);
  const auto order = one.indices();
  for (size_t p = from; p < to; ++p) ++counts[order[p % kSamples]];
}

std::string print(const std::map<size_t, int>& m) {
  std::ostringstream s;
  for (auto& [i, c] : m) s << i << (c == 1 ? "" : "x" + std::to_string(c)) << " ";
  return s.str();
}

struct Case {
  std::string name;
  std::vector<std::string> batch;  // the batch options
  int64_t batch_before, batch_after;  // per process, at 2 and at 3 ranks
  int signal;
  std::string restart_variable;
  int stop_at_step;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

}  // namespace

class ElasticResume : public ::testing::TestWithParam<Case> {};

TEST_P(ElasticResume, EverySampleOfTheEpochOnceAcrossTheChangeOfWorldSize) {
  const Case c = GetParam();
  const auto dir = ddp::testing::temp_dir("elastic");
  const std::string run = dir + "/run";
  std::vector<std::string> args{"train", "--run-dir", run, "--epochs", "2", "--preemption-check-every", "1"};
  args.insert(args.end(), c.batch.begin(), c.batch.end());

  // 2 ranks, stopped by a signal to rank 1 during its step `stop_at_step`:
  // every rank stops at the next check (every step), rank 0 checkpoints.
  auto first = run_ranks(2, DDP_ELASTIC_WORKER, args,
                         {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "first"}, {"STOP_SIGNAL", std::to_string(c.signal)},
                          {"STOP_RANK", "1"}, {"STOP_AT_STEP", std::to_string(c.stop_at_step)}});
  for (auto& r : first) ASSERT_EQ(r.exit_code, ddp::kPreemptedExitCode) << describe(first);

  // 3 ranks: the restart (ddprun's rendezvous round, or torchrun's count).
  auto second = run_ranks(3, DDP_ELASTIC_WORKER, args,
                          {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "second"}, {c.restart_variable, "1"}});
  for (auto& r : second) ASSERT_EQ(r.exit_code, 0) << describe(second);

  const size_t taken = static_cast<size_t>(c.stop_at_step * c.batch_before * 2);
  const std::string log = ddp::testing::read_file(run + "/log.txt");
  EXPECT_NE(log.find("resumed after " + std::to_string(taken) + " of 50 samples of epoch 1"), std::string::npos) << log;
  EXPECT_NE(second[0].output.find("was written by 2 ranks; resuming with 3"), std::string::npos) << second[0].output;
  if (c.batch[0] == "--global-batch-size")  // 3 ranks do not divide it
    EXPECT_NE(second[0].output.find("warning: global batch " + std::to_string(c.batch_after * 3) + " = 3 x " +
                                    std::to_string(c.batch_after)),
              std::string::npos)
        << second[0].output;

  Counts got;
  add_counts(got, run, "first", 2);
  add_counts(got, run, "second", 3);
  // Epoch 0: positions 0..taken-1 at 2 ranks, then the rest at 3 ranks,
  // padded to ceil(rest / 3) * 3 from the permutation's start.
  const size_t rest = kSamples - taken, padded = (rest + 2) / 3 * 3;
  std::map<size_t, int> expected0, expected1;
  add_positions(expected0, 0, 0, taken + padded);
  // Epoch 1, whole at 3 ranks: 51 positions, the first index twice.
  add_positions(expected1, 1, 0, (kSamples + 2) / 3 * 3);
  EXPECT_EQ(got[0], expected0) << "epoch 0 (" << padded - rest << " padding repeats): got " << print(got[0])
                               << "\nexpected " << print(expected0);
  EXPECT_EQ(got[1], expected1) << "epoch 1: got " << print(got[1]) << "\nexpected " << print(expected1);
  size_t distinct = 0;
  for (auto& [i, n] : got[0]) distinct += n > 0;
  EXPECT_EQ(distinct, kSamples) << "every sample of epoch 0 trained on";
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Elastic, ElasticResume,
    ::testing::Values(
        // --batch-size stays per process: 2 x 6, then 3 x 6. 3 steps = 36
        // samples; the other 14 as 3 x 5 (one padding repeat).
        Case{"PerProcessBatchSigusr1", {"--batch-size", "6"}, 6, 6, SIGUSR1, "TORCHELASTIC_RESTART_COUNT", 3},
        // --global-batch-size 8: 2 x 4, then 3 x 2 (global 6, a warning).
        // 5 steps = 40 samples; the other 10 as 3 x 4 (two padding repeats).
        Case{"GlobalBatchSigterm", {"--global-batch-size", "8"}, 4, 2, SIGTERM, "DDPRUN_RDZV_ROUND", 5}),
    [](const auto& info) { return info.param.name; });

// The checks keep working after a change: stopped at 2 ranks (SIGTERM, as
// ddprun's membership change), resumed at 3, preempted there (SIGUSR1 to rank
// 2), resumed at 2 again and run to the end. Each epoch: every index once,
// plus the one padding repeat where 3 ranks took the 14 samples left.
TEST(ElasticResume, APreemptionWarningAfterTheChangeCheckpointsAndTheRunGoesOnAtTwo) {
  const auto dir = ddp::testing::temp_dir("elastic_twice");
  const std::string run = dir + "/run";
  const std::vector<std::string> args{"train", "--run-dir", run, "--epochs", "2", "--preemption-check-every", "1",
                                      "--batch-size", "6"};
  auto first = run_ranks(2, DDP_ELASTIC_WORKER, args,
                         {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "first"}, {"STOP_SIGNAL", std::to_string(SIGTERM)},
                          {"STOP_RANK", "1"}, {"STOP_AT_STEP", "3"}});
  for (auto& r : first) ASSERT_EQ(r.exit_code, ddp::kPreemptedExitCode) << describe(first);
  // At 3: epoch 0's last step (14 samples left, 5 a rank), then epoch 1's
  // first; rank 2 gets SIGUSR1 in that one, and every rank stops before the next.
  auto second = run_ranks(3, DDP_ELASTIC_WORKER, args,
                          {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "second"}, {"DDPRUN_RDZV_ROUND", "1"},
                           {"STOP_SIGNAL", std::to_string(SIGUSR1)}, {"STOP_RANK", "2"}, {"STOP_AT_STEP", "2"}});
  for (auto& r : second) ASSERT_EQ(r.exit_code, ddp::kPreemptedExitCode) << describe(second);
  auto third = run_ranks(2, DDP_ELASTIC_WORKER, args,
                         {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "third"}, {"DDPRUN_RDZV_ROUND", "2"}});
  for (auto& r : third) ASSERT_EQ(r.exit_code, 0) << describe(third);

  const std::string log = ddp::testing::read_file(run + "/log.txt");
  EXPECT_NE(log.find("resumed after 18 of 50 samples of epoch 2"), std::string::npos) << log;
  Counts got;
  add_counts(got, run, "first", 2);
  add_counts(got, run, "second", 3);
  add_counts(got, run, "third", 2);
  std::map<size_t, int> expected0, expected1;
  add_positions(expected0, 0, 0, 36 + 15);  // 36 at 2 ranks, 14 + 1 padding at 3
  add_positions(expected1, 1, 0, 50);       // 18 at 3 ranks, 32 at 2
  EXPECT_EQ(got[0], expected0) << "epoch 0: got " << print(got[0]) << "\nexpected " << print(expected0);
  EXPECT_EQ(got[1], expected1) << "epoch 1: got " << print(got[1]) << "\nexpected " << print(expected1);
  std::filesystem::remove_all(dir);
}

// A ZeRO optimizer saved at 2 ranks and loaded at 3: each rank's share equals
// a fresh 3-rank load of the consolidated state, and trains on alike.
TEST(ElasticZero, SavedAtTwoRanksLoadedAtThreeEachRankHoldsItsShareOfTheWholeState) {
  const auto dir = ddp::testing::temp_dir("elastic_zero");
  auto saved = run_ranks(2, DDP_ELASTIC_WORKER, {"zero_save"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : saved) ASSERT_EQ(r.exit_code, 0) << describe(saved);
  auto loaded = run_ranks(3, DDP_ELASTIC_WORKER, {"zero_load"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : loaded) EXPECT_EQ(r.exit_code, 0) << describe(loaded);
  std::filesystem::remove_all(dir);
}

// A sharded checkpoint written at one world size and loaded at another:
// every rank's parameters, buffers and optimizer state (plain Adam whole, or
// its ZeRO share) are bitwise what the consolidated file gives, and three
// more steps from each end alike; the folder exported to one file loads the
// same. ZeRO's is written in the background while training goes on.
class ShardedCheckpoint : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ShardedCheckpoint, LoadsAtAnotherWorldSizeBitwiseAsTheConsolidatedFile) {
  const auto [saved_at, loaded_at] = GetParam();
  const auto dir = ddp::testing::temp_dir("sharded_checkpoint");
  auto saved = run_ranks(saved_at, DDP_ELASTIC_WORKER, {"sharded_save"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : saved) ASSERT_EQ(r.exit_code, 0) << describe(saved);
  for (const char* kind : {"plain", "zero"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + kind + "/manifest.pt")) << kind;
    for (int r = 0; r < saved_at; ++r) {
      int shards = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir + "/" + kind))
        if (e.path().filename().string().rfind("save-", 0) == 0) {
          ++shards;
          EXPECT_TRUE(std::filesystem::exists(e.path() / ("rank" + std::to_string(r) + ".bin"))) << kind << " rank " << r;
        }
      EXPECT_EQ(shards, 1) << kind;
    }
  }
  auto loaded = run_ranks(loaded_at, DDP_ELASTIC_WORKER, {"sharded_load"}, {{"DDP_TEST_DIR", dir}});
  for (auto& r : loaded) EXPECT_EQ(r.exit_code, 0) << describe(loaded);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedCheckpoint,
                         ::testing::Values(std::make_pair(2, 3), std::make_pair(3, 2), std::make_pair(4, 1)),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "to" + std::to_string(info.param.second);
                         });

// --checkpoint-every-steps: a job whose rank is SIGKILLed inside an epoch
// resumes from a checkpoint the kit wrote in the background at a multiple
// of N steps, and ends with the parameters of an uninterrupted run, bitwise.
// The save of the last multiple is loaded if it reached the disk before
// the job ended, else the one before it. Ranks that share the run folder
// write sharded checkpoints (the folder <run>/checkpoint: that save is
// whole only if the killed rank's part got there first); ranks with a
// folder each (as nodes without a shared file system) get the one file
// <run>/checkpoint.pt, which rank 0 writes alone.
TEST(CheckpointEverySteps, AKilledJobResumesInsideTheEpochAndEndsAsAnUninterruptedRun) {
  const auto dir = ddp::testing::temp_dir("every_steps");
  auto args = [&](const std::string& run) {
    return std::vector<std::string>{"train", "--run-dir", run, "--epochs", "2", "--batch-size", "3",
                                    "--checkpoint-every-steps", "2"};
  };
  auto whole = run_ranks(2, DDP_ELASTIC_WORKER, args(dir + "/whole"), {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "whole"}});
  for (auto& r : whole) ASSERT_EQ(r.exit_code, 0) << describe(whole);
  for (const bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "one shared run folder" : "a run folder each");
    const std::string run = dir + (shared ? "/shared" : "/local");
    const std::string per_rank = shared ? "0" : "1";
    auto first = run_ranks(2, DDP_ELASTIC_WORKER, args(run),
                           {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "first"}, {"STOP_SIGNAL", std::to_string(SIGKILL)},
                            {"STOP_RANK", "1"}, {"STOP_AT_STEP", "5"}, {"RUN_DIR_PER_RANK", per_rank}});
    EXPECT_NE(first[0].exit_code, 0) << describe(first);
    auto second = run_ranks(2, DDP_ELASTIC_WORKER, args(run),
                            {{"DDP_TEST_DIR", dir}, {"ELASTIC_TAG", "second"}, {"TORCHELASTIC_RESTART_COUNT", "1"},
                             {"RUN_DIR_PER_RANK", per_rank}});
    for (auto& r : second) ASSERT_EQ(r.exit_code, 0) << describe(second);
    const std::string folder = shared ? run : run + "/node0";
    const std::string log = ddp::testing::read_file(folder + "/log.txt");
    // Steps 2 and 4 were saved; rank 1 died in step 5: 4 steps of 2 x 3
    // samples, or 2 if the last save was lost with the job.
    EXPECT_TRUE(log.find("resumed after 24 of 50 samples of epoch 1") != std::string::npos ||
                log.find("resumed after 12 of 50 samples of epoch 1") != std::string::npos)
        << log;
    if (shared) {
      EXPECT_NE(log.find("resumed from " + run + "/checkpoint after epoch 0"), std::string::npos) << log;
      EXPECT_FALSE(std::filesystem::exists(run + "/checkpoint.pt"));
    } else {
      EXPECT_NE(log.find("resumed from " + folder + "/checkpoint.pt after epoch 0"), std::string::npos) << log;
      EXPECT_NE(log.find("not every rank sees the run folder"), std::string::npos) << log;
      EXPECT_FALSE(std::filesystem::exists(folder + "/checkpoint"));
      EXPECT_FALSE(std::filesystem::exists(run + "/node1/checkpoint.pt"));
    }
    for (int r = 0; r < 2; ++r) {
      const std::string at = shared ? run : run + "/node" + std::to_string(r);
      const std::string resumed = ddp::testing::read_file(at + "/params." + std::to_string(r));
      EXPECT_FALSE(resumed.empty());
      EXPECT_EQ(resumed, ddp::testing::read_file(dir + "/whole/params." + std::to_string(r))) << "rank " << r;
    }
  }
  std::filesystem::remove_all(dir);
}
