// The training kit under ddprun --recover-in-process: three ranks train
// elastic_worker's tiny model for two epochs, and rank 1 is killed (SIGKILL)
// in its third step, after its backward and before the vote. The other two
// go on in their processes: the failed step commits nowhere and is trained
// again, the rest of the epoch is shared out over two ranks from the samples
// the committed steps took, so every sample of each epoch is trained once
// but the failed step's, twice; --log-samples marks the failed step.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "../support/idx_fixture.h"
#include "../support/multiprocess.h"
#include "ddp/parallel/distributed_sampler.h"

namespace {

constexpr size_t kRecoverySamples = 50;  // elastic_worker.cpp's data set

// How often each position of epoch `epoch`'s permutation was trained, from
// the files `<run>/indices.rec.<rank>` ("epoch index" lines) of `ranks` ranks.
std::map<size_t, int> positions_trained(const std::string& run, int64_t epoch, int ranks = 3) {
  ddp::DistributedSampler one(kRecoverySamples, 1, 0);
  one.set_epoch(epoch);
  std::map<size_t, size_t> position_of;
  const auto order = one.indices();
  for (size_t p = 0; p < order.size(); ++p) position_of[order[p]] = p;
  std::map<size_t, int> counts;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(run + "/indices.rec." + std::to_string(r));
    int64_t e;
    size_t index;
    while (in >> e >> index)
      if (e == epoch) ++counts[position_of.at(index)];
  }
  return counts;
}

std::string print_counts(const std::map<size_t, int>& m) {
  std::ostringstream s;
  for (auto& [p, c] : m) s << p << (c == 1 ? "" : "x" + std::to_string(c)) << " ";
  return s.str();
}

}  // namespace

class RecoveryKit : public ::testing::TestWithParam<int> {};

// GetParam(): the rank killed; when it is rank 0, the new rank 0 writes the
// run folder from then on.
TEST_P(RecoveryKit, AKilledRankCostsOneStepAndEverySampleIsTrainedOnceButThatStepsTwice) {
  const int killed = GetParam();
  const auto dir = ddp::testing::temp_dir("recovery_kit");
  const std::string run = dir + "/run";
  auto r = ddp::testing::run_program(
      DDPRUN_BIN,
      {"--standalone", "--nproc-per-node", "3", "--recover-in-process", DDP_ELASTIC_WORKER, "train", "--run-dir", run,
       "--epochs", "2", "--batch-size", "4", "--recovery-deadline", "5", "--log-samples"},
      {{"ELASTIC_TAG", "rec"}, {"STOP_SIGNAL", std::to_string(SIGKILL)}, {"STOP_RANK", std::to_string(killed)}, {"STOP_AT_STEP", "3"},
       {"OMP_NUM_THREADS", "1"}},
      std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the others go on without it"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 ranks go on from sample 24 of 50"), std::string::npos) << r.output;
  const std::string log = ddp::testing::read_file(run + "/log.txt");
  EXPECT_NE(log.find("2 ranks go on from sample 24 of 50"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 2: "), std::string::npos) << log;

  // Epoch 0: two steps of 3 x 4 (positions 0..23) committed, the third
  // (24..35) failed and trained again by two ranks with the rest (24..49).
  std::map<size_t, int> expected0, expected1;
  for (size_t p = 0; p < kRecoverySamples; ++p) expected0[p] = p >= 24 && p < 36 ? 2 : 1;
  // Epoch 1, at 2 ranks: every position once (50 divides by 2: no padding).
  for (size_t p = 0; p < kRecoverySamples; ++p) expected1[p] = 1;
  EXPECT_EQ(positions_trained(run, 0), expected0) << print_counts(positions_trained(run, 0));
  EXPECT_EQ(positions_trained(run, 1), expected1) << print_counts(positions_trained(run, 1));

  // --log-samples: the survivors mark the failed step 3, and log it again.
  for (int slot = 0; slot < 3; ++slot) {
    if (slot == killed) continue;
    const std::string samples = ddp::testing::read_file(run + "/samples/rank" + std::to_string(slot) + ".txt");
    EXPECT_NE(samples.find("# failed 0 0 3 "), std::string::npos) << samples;
    EXPECT_NE(samples.find("\n0 0 3 "), std::string::npos) << samples;
  }
  std::filesystem::remove_all(dir);
}

// With --max-restarts 1 ddprun starts a worker in rank 1's place; the two
// others take it in between two steps and hand it the model and the
// position, and a ZeroRedundancyOptimizer (SGD with momentum) its shards:
// it trains on with them, and every sample of each epoch is still trained
// (the failed step's twice, the shards' padding once more).
TEST(RecoveryKitJoin, AReplacementTakesTheStateFromThePeersAndTrainsOn) {
  const auto dir = ddp::testing::temp_dir("recovery_kit_join");
  const std::string run = dir + "/run";
  auto r = ddp::testing::run_program(
      DDPRUN_BIN,
      {"--standalone", "--nproc-per-node", "3", "--recover-in-process", "--max-restarts", "1", DDP_ELASTIC_WORKER,
       "train", "--run-dir", run, "--epochs", "3", "--batch-size", "4", "--recovery-deadline", "5", "--log-samples"},
      {{"ELASTIC_TAG", "rec"}, {"STOP_SIGNAL", std::to_string(SIGKILL)}, {"STOP_RANK", "1"}, {"STOP_AT_STEP", "3"},
       {"ELASTIC_STEP_MS", "400"}, {"ELASTIC_ZERO", "1"}, {"OMP_NUM_THREADS", "1"}},
      std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting a worker in place of rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("joined the running group"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("re-sharded over launch ranks 0,1,2"), std::string::npos) << r.output;
  const std::string log = ddp::testing::read_file(run + "/log.txt");
  EXPECT_NE(log.find("ranks joined"), std::string::npos) << log;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const auto got = positions_trained(run, epoch);
    int extra = 0;
    for (size_t p = 0; p < kRecoverySamples; ++p) {
      const auto it = got.find(p);
      EXPECT_TRUE(it != got.end() && it->second >= 1) << "epoch " << epoch << " position " << p << ": "
                                                      << print_counts(got);
      if (it != got.end()) extra += it->second - 1;
    }
    // Epoch 0: the failed step's 12 again, padding at most 2 at each new size.
    EXPECT_LE(extra, epoch == 0 ? 16 : 2) << "epoch " << epoch << ": " << print_counts(got);
  }
  // The replacement ends with its peers' model, bitwise.
  const std::string params0 = ddp::testing::read_file(run + "/params.0");
  EXPECT_FALSE(params0.empty());
  for (int r = 1; r < 3; ++r)
    EXPECT_EQ(ddp::testing::read_file(run + "/params." + std::to_string(r)), params0) << "rank " << r;
  std::filesystem::remove_all(dir);
}

// Rank 1 is killed in the first epoch's evaluation: the two others re-form
// and evaluate the whole data set again between them (their samplers follow
// the group), and the second epoch trains at two ranks.
TEST(RecoveryKitEval, ARankLostInTheEvaluationCostsTheEvaluationAgain) {
  const auto dir = ddp::testing::temp_dir("recovery_kit_eval");
  const std::string run = dir + "/run";
  auto r = ddp::testing::run_program(
      DDPRUN_BIN,
      {"--standalone", "--nproc-per-node", "3", "--recover-in-process", DDP_ELASTIC_WORKER, "train", "--run-dir", run,
       "--epochs", "2", "--batch-size", "4", "--recovery-deadline", "5"},
      {{"ELASTIC_TAG", "rec"}, {"STOP_SIGNAL", std::to_string(SIGKILL)}, {"STOP_RANK", "1"}, {"STOP_IN_EVAL", "0"},
       {"OMP_NUM_THREADS", "1"}},
      std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the evaluation failed"), std::string::npos) << r.output;
  const std::string log = ddp::testing::read_file(run + "/log.txt");
  EXPECT_NE(log.find("epoch 1: eval 50 samples"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 2: eval 50 samples"), std::string::npos) << log;
  const std::string metrics = ddp::testing::read_file(run + "/metrics.csv");
  EXPECT_NE(metrics.find("\n1,"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\n2,"), std::string::npos) << metrics;
  std::map<size_t, int> once;
  for (size_t p = 0; p < kRecoverySamples; ++p) once[p] = 1;
  EXPECT_EQ(positions_trained(run, 1), once) << print_counts(positions_trained(run, 1));
  std::filesystem::remove_all(dir);
}

// Two nodes of two ranks, --nnodes 2: node 1 is lost as a whole (its worker
// SIGKILLs its ddprun, then itself) in the third step. One node is fewer
// than the minimum: node 0's ranks do not go on; the first of them saves
// the last committed step as the run's checkpoint and both exit 75, which
// ddprun passes on. Resumed from it at two ranks, the run trains every
// position of the epoch, the failed step's twice.
TEST(RecoveryKitTooFew, BelowTheMinimumTheWorkIsSavedAndTheRunExits75) {
  const auto dir = ddp::testing::temp_dir("recovery_kit_few");
  const std::string run = dir + "/run", port = std::to_string(ddp::testing::free_port());
  const std::map<std::string, std::string> env{{"ELASTIC_TAG", "rec"}, {"STOP_SIGNAL", std::to_string(SIGKILL)},
                                               {"STOP_RANK", "2"}, {"STOP_AT_STEP", "3"}, {"STOP_NODE", "1"},
                                               {"OMP_NUM_THREADS", "1"}};
  std::vector<pid_t> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.push_back(ddp::testing::spawn(
        DDPRUN_BIN,
        {"--nnodes", "2", "--node-rank", std::to_string(node), "--master-port", port, "--nproc-per-node", "2",
         "--recover-in-process", "--rdzv-conf", "keep_alive_interval=0.5,keep_alive_max_attempt=4", DDP_ELASTIC_WORKER,
         "train", "--run-dir", run, "--epochs", "2", "--batch-size", "4", "--recovery-deadline", "5"},
        env, dir + "/node" + std::to_string(node) + ".log"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  std::vector<int> codes;
  for (pid_t pid : nodes) codes.push_back(ddp::testing::wait_exit_code(pid, until, [pid] { ::kill(-pid, SIGKILL); }));
  for (pid_t pid : nodes) ::kill(-pid, SIGKILL);  // what node 1 left
  const std::string out = ddp::testing::read_file(dir + "/node0.log");
  ASSERT_EQ(codes[0], 75) << out;
  EXPECT_NE(out.find("fewer than the minimum of 1 ranks on 2 nodes"), std::string::npos) << out;
  EXPECT_NE(out.find("the last committed step is saved in " + run + "/checkpoint.pt"), std::string::npos) << out;

  // Two committed steps of 4 x 4 (positions 0..31), the third (32..47) failed.
  auto r = ddp::testing::run_program(
      DDPRUN_BIN,
      {"--standalone", "--nproc-per-node", "2", DDP_ELASTIC_WORKER, "train", "--run-dir", run, "--epochs", "2",
       "--batch-size", "4", "--resume", run + "/checkpoint.pt"},
      {{"ELASTIC_TAG", "rec"}, {"OMP_NUM_THREADS", "1"}}, std::chrono::seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed after 32 of 50 samples of epoch 1"), std::string::npos) << r.output;
  const auto got = positions_trained(run, 0, 4);
  for (size_t p = 0; p < kRecoverySamples; ++p) {
    const int count = got.count(p) ? got.at(p) : 0;
    if (p < 32 || p >= 48) EXPECT_EQ(count, 1) << "position " << p << ": " << print_counts(got);
    else EXPECT_TRUE(count == 1 || count == 2) << "position " << p << ": " << print_counts(got);
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Killed, RecoveryKit, ::testing::Values(1, 0),
                         [](const auto& info) { return "Rank" + std::to_string(info.param); });
