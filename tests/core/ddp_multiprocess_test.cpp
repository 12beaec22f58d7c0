// DistributedDataParallel across real processes over real Gloo on loopback.
#include <gtest/gtest.h>

#include "multiprocess.h"

using ddp::testing::describe;
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

TEST_P(DDPWorld, NoSyncAccumulatesLocallyThenReducesTheSum) { expect_all_pass(GetParam(), {"no_sync"}); }

TEST_P(DDPWorld, DifferentModelsFailOnEveryRankWithinTheTimeout) {
  expect_all_pass(GetParam(), {"mismatch", "--timeout", "60"});
}

TEST(DDPMalloc, LargeGradientsFixGlibcThresholdsAtTheirSizeSmallOnesLeaveThemAlone) {
  for (const char* model : {"large", "small"}) {
    auto results = run_ranks(2, DDP_WORKER, {"malloc", "--model", model});
    for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << model << "\n" << describe(results);
  }
}

TEST(DDPMalloc, EnvironmentTurnsItOffAndRejectsANonNumber) {
  auto off = run_ranks(2, DDP_WORKER, {"malloc", "--model", "large"}, {{"DDP_MALLOC_MMAP_THRESHOLD_MB", "0"}});
  for (const auto& r : off) ASSERT_EQ(r.exit_code, 0) << describe(off);
  auto bad = run_ranks(2, DDP_WORKER, {"malloc", "--model", "large", "--expect-error", "is not a number"},
                       {{"DDP_MALLOC_MMAP_THRESHOLD_MB", "16MB"}});
  for (const auto& r : bad) ASSERT_EQ(r.exit_code, 0) << describe(bad);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DDPWorld, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });
