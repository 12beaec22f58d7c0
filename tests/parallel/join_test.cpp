// ddp::Join on uneven inputs, over real processes and real Gloo: ours and
// PyTorch 1.13's Join (Debian's python3-torch, the same LibTorch kernels)
// train the same models on ranks with different numbers of batches (5 and 7,
// 9 and 5, 5, 7 and 9) and must end with bitwise-identical parameters and
// buffers on every rank, case by case (defaults, several buckets with a
// rebuild that reorders, divide_by_initial_world_size(false),
// find_unused_parameters, no_sync, BatchNorm buffers, comm hooks, a rank that
// joins before the rebuild, enable(false) on even inputs, DistributedSampler
// without padding). throw_on_early_termination makes every rank throw; a
// guard left by the loop's exception lets it through; enable(false) asks for
// no collective of its own; a Joinable of one's own takes part beside DDP;
// and without Join, uneven inputs end in an error that says to use it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "../support/located.h"
#include "../support/multiprocess.h"
#include "../support/parity_compare.h"

using namespace ddp::testing;

namespace {

const std::vector<std::string> kCases = {"default",   "buckets",        "no_divide", "find_unused", "no_sync",
                                         "batchnorm", "hook_allreduce", "hook_fp16", "early_join",  "disabled",
                                         "static"};

// What pytorch_join_parity.py imports beyond torch itself.
const std::string kImports = "torch.distributed.algorithms.join";

// Runs ours, then PyTorch's, at len(batches) ranks, and compares every case
// on every rank bitwise.
void expect_bitwise_equal_to_pytorch(const std::string& batches, const std::vector<std::string>& cases) {
  const int world = static_cast<int>(std::count(batches.begin(), batches.end(), ',')) + 1;
  char tmpl[] = "/tmp/ddp_join_parity_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto ours = run_ranks(world, DDP_WORKER,
                        {"join_parity", "--out", dir, "--cases", join_commas(cases), "--batches", batches},
                        {{"DDP_TEST_DIR", dir}});
  for (const auto& r : ours) ASSERT_EQ(r.exit_code, 0) << describe(ours);
  auto theirs = run_ranks(world, oracle_python(), {JOIN_PARITY_SCRIPT, dir, join_commas(cases), batches},
                          {{"DDP_TEST_DIR", dir}});
  for (const auto& r : theirs) ASSERT_EQ(r.exit_code, 0) << describe(theirs);
  for (const auto& c : cases) {
    FloatDiff diff;
    for (int rank = 0; rank < world; ++rank)
      ASSERT_NO_FATAL_FAILURE(diff.add(dir, c + "_rank" + std::to_string(rank) + ".bin"));
    std::cout << "batches " << batches << ", " << c << ": " << diff.total << " values, " << diff.differing
              << " differ\n";
    EXPECT_EQ(diff.differing, 0u) << c << " with batches " << batches;
  }
  std::filesystem::remove_all(dir);
}

class JoinParity : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(JoinParity, BitwiseEqualToPyTorchJoinOnUnevenInputs) {
  if (!have_pytorch(kImports)) GTEST_SKIP() << oracle_python() << " with torch is not installed (apt-get install python3-torch)";
  expect_bitwise_equal_to_pytorch(GetParam(), kCases);
}

INSTANTIATE_TEST_SUITE_P(Batches, JoinParity, ::testing::Values("5,7", "9,5", "5,7,9"), [](const auto& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), ',', '_');
  return "batches_" + name;
});

// 33 samples in batches of 4 over 2 ranks, unpadded: 5 batches on rank 0,
// 4 on rank 1, for two epochs, under ddp::join.
TEST(Join, UnpaddedDistributedSamplerShardsTrainAsPyTorchJoin) {
  if (!have_pytorch(kImports)) GTEST_SKIP() << oracle_python() << " with torch is not installed (apt-get install python3-torch)";
  expect_bitwise_equal_to_pytorch("0,0", {"sampler"});
}

TEST(Join, ThrowOnEarlyTerminationThrowsOnEveryRank) {
  for (const std::string batches : {"5,7", "5,7,9"}) {
    const int world = batches == "5,7" ? 2 : 3;
    auto ranks = run_ranks(world, DDP_WORKER, {"join_throw", "--batches", batches});
    for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << describe(ranks);
    EXPECT_NE(ranks[0].output.find("exhausted all inputs"), std::string::npos) << ranks[0].output;
    for (int r = 1; r < world; ++r)
      EXPECT_NE(ranks[r].output.find("detected at least one rank that exhausted inputs"), std::string::npos)
          << ranks[r].output;
  }
}

TEST(Join, AGuardLeftByAnExceptionLetsItThroughWithoutShadowing) {
  auto ranks = run_ranks(2, DDP_WORKER, {"join_throw", "--batches", "5,7", "--user-throw", "1"});
  for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << describe(ranks);
}

// A Joinable of one's own (a loss meter all-reduced every iteration) beside
// DDP: joined ranks answer its all-reduce too, in the joinables' order.
TEST(Join, AJoinableOfOnesOwnTakesPartBesideTheModel) {
  auto ranks = run_ranks(3, DDP_WORKER, {"join_custom", "--batches", "5,7,9"});
  for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << describe(ranks);
}

TEST(Join, DisabledAsksForTheCollectivesOfNoJoin) {
  auto ranks = run_ranks(2, DDP_WORKER, {"join_disabled"});
  for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << describe(ranks);
}

// Without Join, the rank with 7 batches finds its 6th backward's all-reduce
// answered by nobody: the rank with 5 left (exit) or waits in a barrier. It
// must fail, not hang, with an error naming it and saying what to do; within
// the 5 s timeout the workers are given (short: the barrier case waits it out).
TEST(Join, UnevenInputsWithoutJoinFailWithAnErrorThatSaysToUseJoin) {
  for (const std::string after : {"exit", "barrier"}) {
    const auto start = std::chrono::steady_clock::now();
    auto ranks = run_ranks(2, DDP_WORKER, {"join_missing", "--batches", "5,7", "--after", after, "--timeout", "5"}, {},
                           std::chrono::seconds(90));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "after " << after << ": " << seconds << " s\n" << describe(ranks);
    EXPECT_LT(seconds, 60) << after;
    const auto& late = ranks[1];
    EXPECT_NE(late.exit_code, 0) << describe(ranks);
    EXPECT_NE(late.exit_code, 128 + 9) << "killed: it hung\n" << describe(ranks);
    EXPECT_NE(late.output.find("rank 1"), std::string::npos) << late.output;
    EXPECT_NE(late.output.find("different numbers of batches"), std::string::npos) << late.output;
    EXPECT_NE(late.output.find("ddp::Join"), std::string::npos) << late.output;
    EXPECT_NE(late.output.find("drop_last"), std::string::npos) << late.output;
    if (after == "barrier") {
      // The early rank's own collective fails too, with the same advice.
      EXPECT_NE(ranks[0].exit_code, 0) << describe(ranks);
      EXPECT_NE(ranks[0].output.find("ddp::Join"), std::string::npos) << ranks[0].output;
    }
  }
}
