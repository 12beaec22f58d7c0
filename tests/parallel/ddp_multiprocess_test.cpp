// DistributedDataParallel across real processes over real Gloo on loopback.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../support/located.h"
#include "../support/multiprocess.h"
#include "../support/parity_compare.h"

using ddp::testing::describe;
using ddp::testing::have_pytorch;
using ddp::testing::read_file;
using ddp::testing::run_ranks;

namespace {

void expect_all_pass(int world, const std::vector<std::string>& args) {
  auto results = run_ranks(world, DDP_WORKER, args);
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}

class DDPWorld : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(DDPWorld, GradientsEqualTheConcatenatedBatchAndParametersStayIdentical) {
  expect_all_pass(GetParam(), {"grads", "--steps", "20"});
}

TEST_P(DDPWorld, RankSkewedInitialWeightsAreSynchronised) {
  expect_all_pass(GetParam(), {"grads", "--skew", "1", "--steps", "3"});
}

TEST_P(DDPWorld, SeveralBucketsAndTheirRebuild) {
  expect_all_pass(GetParam(), {"grads", "--bucket-cap-mb", "0.002", "--first-bucket-mb", "0.001", "--min-buckets",
                               "3", "--steps", "5"});
}

TEST_P(DDPWorld, RebuildReordersBucketsToTheRealReadyOrder) {
  expect_all_pass(GetParam(), {"grads", "--reversed", "1", "--bucket-cap-mb", "0.002", "--first-bucket-mb", "0.001",
                               "--min-buckets", "3", "--steps", "5"});
}

TEST_P(DDPWorld, GradientsCopiedWhenNotBucketViews) {
  expect_all_pass(GetParam(), {"grads", "--as-view", "0", "--bucket-cap-mb", "0.002", "--steps", "4"});
}

TEST_P(DDPWorld, MixedFloatAndDoubleParameters) {
  expect_all_pass(GetParam(), {"grads", "--mixed", "1", "--steps", "4", "--min-buckets", "2"});
}

TEST_P(DDPWorld, BatchNormBuffersFollowRankZero) { expect_all_pass(GetParam(), {"batchnorm"}); }

TEST_P(DDPWorld, UnusedParametersOnEveryRankKeepNoGradient) {
  expect_all_pass(GetParam(), {"unused", "--mode", "none"});
}

TEST_P(DDPWorld, ParameterUsedOnlyOnRankZeroIsAveragedEverywhere) {
  expect_all_pass(GetParam(), {"unused", "--mode", "rank0"});
}

TEST_P(DDPWorld, UnusedParameterWithoutFindUnusedIsAClearError) {
  expect_all_pass(GetParam(), {"unused", "--mode", "error"});
}

TEST_P(DDPWorld, StaticGraphAllReducesTheUsageMapOnceWhereFindUnusedDoesEveryStep) {
  expect_all_pass(GetParam(), {"static_graph", "--mode", "collectives"});
}

// PyTorch 1.13 fails an internal assert here; ours matches one process.
TEST_P(DDPWorld, StaticGraphWithNoSyncAccumulatesAsOneProcess) {
  expect_all_pass(GetParam(), {"static_graph", "--mode", "no_sync"});
}

TEST_P(DDPWorld, StaticGraphParameterUsedAfterTheFirstIterationIsAUsageError) {
  expect_all_pass(GetParam(), {"static_graph", "--mode", "used_later"});
}

TEST_P(DDPWorld, StaticGraphParameterUnusedAfterTheFirstIterationIsAUsageError) {
  expect_all_pass(GetParam(), {"static_graph", "--mode", "unused_later"});
}

// DDP_TIMELINE: rank 0 writes one trace for the job; check_timeline.py checks
// a process row per rank, compute and communication rows, every bucket
// ready <= launched <= done in launch order, and one time base: no rank sees
// an all-reduce end before every rank launched it.
TEST_P(DDPWorld, TimelineTraceHasEveryBucketInOrderOnOneTimeBase) {
  char tmpl[] = "/tmp/ddp_timeline_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string trace = dir + "/trace.json";
  auto results = run_ranks(GetParam(), DDP_WORKER, {"timeline", "--steps", "4"},
                           {{"DDP_TEST_DIR", dir}, {"DDP_TIMELINE", trace}});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  const std::string check = std::string("python3 ") + CHECK_TIMELINE + " " + trace + " " +
                            std::to_string(GetParam()) + " 4";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  std::filesystem::remove_all(dir);
}

// Rank 1 stops (SIGSTOP) for 4 s before a backward; with a 1 s stall check
// every other rank names it, and the bucket it waits for, long before the
// group's timeout; then rank 1 goes on and the job ends normally.
TEST_P(DDPWorld, StallInspectorNamesTheRankThatHasNotLaunchedTheBucket) {
  auto results = run_ranks(GetParam(), DDP_WORKER, {"stall", "--stop-seconds", "4"},
                           {{"DDP_STALL_CHECK_TIME_SECONDS", "1"}});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& out = results[rank].output;
    if (rank == 1) {
      EXPECT_EQ(out.find("DDP stall"), std::string::npos) << describe(results);
      continue;
    }
    EXPECT_NE(out.find("rank " + std::to_string(rank) + ": DDP stall: the all-reduce of bucket 0 of step 2"),
              std::string::npos)
        << describe(results);
    EXPECT_NE(out.find("rank(s) 1 have not launched it"), std::string::npos) << describe(results);
    EXPECT_NE(out.find("parameter(s)"), std::string::npos) << describe(results);
  }
}

// bucket_cap_mb("auto"): the distinct candidates are tried while training
// (gradients stay those of one process), every rank keeps the same cap, and
// rank 0 prints what each cost.
TEST_P(DDPWorld, AutoBucketCapTriesEachDistinctCapAndEveryRankKeepsTheSame) {
  auto results = run_ranks(GetParam(), DDP_WORKER, {"auto_bucket"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  EXPECT_NE(results[0].output.find("rank 0: DistributedDataParallel: bucket_cap_mb auto: 0.001 MB: "),
            std::string::npos)
      << describe(results);
}

// Under ddp::Join, ranks that ran out shadow the remaining trials and the
// agreement, so no collective is left unmatched.
TEST_P(DDPWorld, AutoBucketCapUnderJoinShadowsTheTrials) {
  if (GetParam() < 2) GTEST_SKIP() << "needs uneven inputs across ranks";
  expect_all_pass(GetParam(), {"auto_bucket", "--join", "1"});
}

// PyTorch's DDP logging data: the figures add up (scenario), and every key
// the oracle PyTorch reports for the same configuration is there
// (check_logging_keys.py runs PyTorch's as a job of one, then compares).
TEST_P(DDPWorld, LoggingDataHasPyTorchsKeysAndConsistentFigures) {
  char tmpl[] = "/tmp/ddp_logging_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto results = run_ranks(GetParam(), DDP_WORKER, {"logging_data", "--out", dir + "/ours.json"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  if (!have_pytorch("torch.distributed")) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << DDP_ORACLE_PYTHON << " with torch is not installed (apt-get install python3-torch)";
  }
  auto theirs = run_ranks(1, DDP_ORACLE_PYTHON, {CHECK_LOGGING_KEYS, "write", dir + "/theirs.json"},
                          {{"DDP_TEST_DIR", dir}});
  ASSERT_EQ(theirs[0].exit_code, 0) << theirs[0].output;
  const std::string check = std::string(DDP_ORACLE_PYTHON) + " " + CHECK_LOGGING_KEYS + " compare " + dir +
                            "/theirs.json " + dir + "/ours.json";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  std::filesystem::remove_all(dir);
}

// DDP_TIMELINE_SKEW_EVERY=2 over 5 steps: tables of steps 1-2 and 3-4, then
// the whole run's, on rank 0's console and in <trace>.skew.txt.
TEST_P(DDPWorld, TimelineSkewTableEveryNStepsAndAtTheEnd) {
  char tmpl[] = "/tmp/ddp_skew_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto results = run_ranks(GetParam(), DDP_WORKER, {"timeline", "--steps", "5"},
                           {{"DDP_TIMELINE", dir + "/trace.json"}, {"DDP_TIMELINE_SKEW_EVERY", "2"}});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  const std::string tables = read_file(dir + "/trace.skew.txt");
  for (const char* when : {"in steps 1-2", "in steps 3-4", "in the whole run"}) {
    EXPECT_NE(results[0].output.find(std::string("rank 0: DDP skew ") + when), std::string::npos) << describe(results);
    EXPECT_NE(tables.find(when), std::string::npos) << tables;
  }
  EXPECT_EQ(tables.find("in steps 5-"), std::string::npos) << tables;
  for (size_t r = 1; r < results.size(); ++r)
    EXPECT_EQ(results[r].output.find("DDP skew"), std::string::npos) << "only rank 0 prints the table";
  std::filesystem::remove_all(dir);
}

TEST_P(DDPWorld, TimelineSkewEveryThatIsNotANumberIsAUsageErrorOnEveryRank) {
  auto results = run_ranks(GetParam(), DDP_WORKER, {"timeline", "--steps", "1"},
                           {{"DDP_TIMELINE", "/tmp/unused_trace.json"}, {"DDP_TIMELINE_SKEW_EVERY", "2x"}});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_NE(results[r].exit_code, 0) << describe(results);
    EXPECT_NE(results[r].output.find("rank " + std::to_string(r) + ": DDP_TIMELINE_SKEW_EVERY='2x' is not a whole"),
              std::string::npos)
        << describe(results);
  }
}

TEST_P(DDPWorld, CommHookTwiceOrAfterTheFirstBackwardIsAUsageError) {
  expect_all_pass(GetParam(), {"comm_hook_usage"});
}

TEST_P(DDPWorld, CommHookSeesEveryBucketUndividedAndItsResultIsTheGradient) {
  expect_all_pass(GetParam(), {"comm_hook_semantics"});
}

// LibTorch 1.13's Gloo has no bfloat16 sum: the hook's error says so.
TEST_P(DDPWorld, Bf16CompressHookOverGlooWorksOrSaysWhyNot) {
  expect_all_pass(GetParam(), {"comm_hook_bf16"});
  expect_all_pass(GetParam(), {"comm_hook_bf16", "--hook", "wrapper"});
}

TEST_P(DDPWorld, NoSyncAccumulatesLocallyThenReducesTheSum) { expect_all_pass(GetParam(), {"no_sync"}); }

TEST_P(DDPWorld, DifferentModelsFailOnEveryRankWithinTheTimeout) {
  expect_all_pass(GetParam(), {"mismatch", "--timeout", "60"});
}

TEST_P(DDPWorld, GradientsResetToNoneEveryStep) {
  expect_all_pass(GetParam(), {"grads", "--set-to-none", "1", "--bucket-cap-mb", "0.002", "--first-bucket-mb",
                               "0.001", "--steps", "5"});
}

TEST_P(DDPWorld, LayerAppliedTwiceIsOneParameter) { expect_all_pass(GetParam(), {"tied", "--shape", "sequential"}); }

TEST_P(DDPWorld, EmbeddingTiedToTheOutputLayerIsOneParameter) {
  expect_all_pass(GetParam(), {"tied", "--shape", "embedding"});
}

TEST_P(DDPWorld, TiedWeightsCopiedWhenNotBucketViews) {
  expect_all_pass(GetParam(), {"tied", "--shape", "embedding", "--as-view", "0"});
}

// `head->weight = emb->weight`, PyTorch's way to tie: LibTorch keeps head's
// old registered tensor, which gets no gradient. The error says so, and how
// to tie, rather than only suggesting find_unused_parameters.
TEST_P(DDPWorld, ReassignedLinearWeightErrorNamesTheMemberNotFindUnused) {
  expect_all_pass(GetParam(), {"tied_reassigned", "--layer", "linear"});
}

TEST_P(DDPWorld, ReassignedMemberOfAnOwnLayerIsTheFirstLikelyCause) {
  expect_all_pass(GetParam(), {"tied_reassigned", "--layer", "custom"});
}

// A weight registered twice: one warning, on rank 0, at construction; SGD
// over ddp::unique_parameters steps it once.
TEST_P(DDPWorld, WeightListedTwiceWarnsOnceAndUniqueParametersStepItOnce) {
  auto results = run_ranks(GetParam(), DDP_WORKER, {"tied_step"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::string warning = "lists 1 tensor(s) more than once: 'emb.weight' (also 'head.weight')";
  EXPECT_EQ(count(results[0].output, warning), 1u) << results[0].output;
  EXPECT_LT(results[0].output.find(warning), results[0].output.find("rank 0: constructed")) << results[0].output;
  EXPECT_NE(results[0].output.find("ddp::unique_parameters(module)"), std::string::npos) << results[0].output;
  for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(count(results[r].output, "warning"), 0u) << describe(results);
}

TEST_P(DDPWorld, BranchUsedOnlyUnderNoSyncIsReducedNotZeroed) {
  expect_all_pass(GetParam(), {"no_sync", "--unused-branch", "1"});
}

TEST_P(DDPWorld, HookWithoutGradientOnOneRankStillRebuildsTogether) {
  expect_all_pass(GetParam(), {"undefined_grad", "--timeout", "30"});
}

TEST_P(DDPWorld, FrozenLayerOnOneRankIsANamedError) {
  expect_all_pass(GetParam(), {"mismatch", "--kind", "frozen", "--timeout", "60"});
}

TEST_P(DDPWorld, DifferentWeightLayoutOnOneRankIsANamedError) {
  expect_all_pass(GetParam(), {"mismatch", "--kind", "strides", "--timeout", "60"});
}

TEST_P(DDPWorld, SparseEmbeddingIsRefusedAtConstruction) { expect_all_pass(GetParam(), {"sparse"}); }

TEST_P(DDPWorld, ReentrantBackwardFinalizesWithTheOuterOne) {
  expect_all_pass(GetParam(), {"reentrant", "--timeout", "30"});
}

TEST_P(DDPWorld, FailedBackwardIsWaitedForBeforeTheNextIteration) {
  expect_all_pass(GetParam(), {"failed_backward", "--timeout", "30"});
}

TEST_P(DDPWorld, BuffersBroadcastOncePerAccumulationCycle) { expect_all_pass(GetParam(), {"buffers_once"}); }

TEST_P(DDPWorld, ChannelsLastWeightGetsAChannelsLastBucketView) {
  expect_all_pass(GetParam(), {"channels_last"});
}

TEST(DDPMalloc, ThresholdsAreLeftToGlibcUnlessAskedForAndThenFixedAtTheLargeGradient) {
  for (const char* model : {"large", "small"}) {
    for (const char* automatic : {"0", "1"}) {
      auto results = run_ranks(2, DDP_WORKER, {"malloc", "--model", model, "--auto", automatic});
      for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << model << " auto " << automatic << "\n" << describe(results);
    }
  }
}

TEST(DDPMalloc, EnvironmentChoosesAndRejectsANonNumber) {
  auto on = run_ranks(2, DDP_WORKER, {"malloc", "--model", "large"}, {{"DDP_MALLOC_MMAP_THRESHOLD_MB", "-1"}});
  for (const auto& r : on) ASSERT_EQ(r.exit_code, 0) << describe(on);
  auto off = run_ranks(2, DDP_WORKER, {"malloc", "--model", "large", "--auto", "1"},
                       {{"DDP_MALLOC_MMAP_THRESHOLD_MB", "0"}});
  for (const auto& r : off) ASSERT_EQ(r.exit_code, 0) << describe(off);
  auto bad = run_ranks(2, DDP_WORKER, {"malloc", "--model", "large", "--expect-error", "is not a number"},
                       {{"DDP_MALLOC_MMAP_THRESHOLD_MB", "16MB"}});
  for (const auto& r : bad) ASSERT_EQ(r.exit_code, 0) << describe(bad);
}

// The small-model slow regime: with gradients as bucket views nothing kept glibc
// from returning a step's heap at its end, and every step faulted it back in.
TEST(DDPMalloc, AStepDoesNotFaultItsMemoryInAgain) {
  auto results = run_ranks(2, DDP_WORKER, {"step_memory"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DDPWorld, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });
