#include <gtest/gtest.h>

#include "ddp/parallel/ddp_options.h"
#include "parallel/reducer/bucket_assignment.h"

using Buckets = std::vector<std::vector<size_t>>;

namespace {
std::vector<size_t> reversed(size_t n) {
  std::vector<size_t> o(n);
  for (size_t i = 0; i < n; ++i) o[i] = n - 1 - i;
  return o;
}
}  // namespace

TEST(BucketAssignment, SmallFirstBucketThenCap) {
  // 4 float tensors of 100 bytes each; first bucket 150 bytes, the rest 250.
  std::vector<at::Tensor> p(4, torch::zeros({25}));
  auto b = ddp::compute_bucket_assignment(p, reversed(4), 150, 250);
  EXPECT_EQ(b, (Buckets{{3, 2}, {1, 0}}));
}

TEST(BucketAssignment, LargeTensorIsNeverSplit) {
  std::vector<at::Tensor> p{torch::zeros({10}), torch::zeros({1000}), torch::zeros({10})};
  auto b = ddp::compute_bucket_assignment(p, reversed(3), 100, 100);
  EXPECT_EQ(b, (Buckets{{2, 1}, {0}}));
}

TEST(BucketAssignment, DtypesGoToDifferentBuckets) {
  std::vector<at::Tensor> p{torch::zeros({4}), torch::zeros({4}, torch::kDouble), torch::zeros({4}),
                            torch::zeros({4}, torch::kDouble)};
  auto b = ddp::compute_bucket_assignment(p, reversed(4), 1 << 20, 1 << 20);
  EXPECT_EQ(b, (Buckets{{3, 1}, {2, 0}}));
}

TEST(BucketAssignment, FollowsTheGivenReadyOrder) {
  std::vector<at::Tensor> p(4, torch::zeros({25}));
  auto b = ddp::compute_bucket_assignment(p, {1, 3, 0, 2}, 200, 200);
  EXPECT_EQ(b, (Buckets{{1, 3}, {0, 2}}));
}

TEST(BucketAssignment, BucketsLaunchByTheirLastMember) {
  // A float bucket whose first member is ready first but whose last member
  // is ready last must not hold back the double bucket.
  std::vector<at::Tensor> p{torch::zeros({4}), torch::zeros({4}, torch::kDouble), torch::zeros({4}, torch::kDouble),
                            torch::zeros({4}, torch::kDouble), torch::zeros({4})};
  auto b = ddp::compute_bucket_assignment(p, {0, 1, 2, 3, 4}, 1 << 20, 1 << 20);
  EXPECT_EQ(b, (Buckets{{1, 2, 3}, {0, 4}}));
}

TEST(BucketAssignment, FirstIterationIsOneBucketPerDtypeAsPyTorch) {
  std::vector<at::Tensor> p{torch::zeros({25}), torch::zeros({25}, torch::kDouble), torch::zeros({25}),
                            torch::zeros({25})};
  auto b = ddp::initial_bucket_assignment(p, 150, 250, /*find_unused_parameters=*/false);
  EXPECT_EQ(b, (Buckets{{1}, {0, 2, 3}}));
}

TEST(BucketAssignment, FirstIterationWithFindUnusedPacksInRegistrationOrderThenReverses) {
  // 100 bytes each; the first bucket (in registration order) closes at 150
  // bytes, the rest at 250: {0,1}, {2,3,4}, {5}; reversed for the ready order.
  std::vector<at::Tensor> p(6, torch::zeros({25}));
  auto b = ddp::initial_bucket_assignment(p, 150, 250, /*find_unused_parameters=*/true);
  EXPECT_EQ(b, (Buckets{{5}, {2, 3, 4}, {0, 1}}));
}

// The first bucket's cap as the DDP of the LibTorch built against: 1.13
// always 1 MiB unless given; 2.x a given bucket_cap_mb (its small first
// bucket only with the default cap).
TEST(BucketAssignment, FirstBucketCapFollowsTheLibTorchVersionsDDP) {
  EXPECT_EQ(ddp::first_bucket_mb_in_effect(ddp::DDPOptions()), 1.0);
  EXPECT_EQ(ddp::first_bucket_mb_in_effect(ddp::DDPOptions().first_bucket_mb(0.5).bucket_cap_mb(8)), 0.5);
  EXPECT_EQ(ddp::first_bucket_mb_in_effect(ddp::DDPOptions().bucket_cap_mb("auto")), 1.0);
  const double given_cap = ddp::first_bucket_mb_in_effect(ddp::DDPOptions().bucket_cap_mb(8));
#if TORCH_VERSION_MAJOR >= 2
  EXPECT_EQ(given_cap, 8.0);
#else
  EXPECT_EQ(given_cap, 1.0);
#endif
}

TEST(BucketAssignment, OneLimitPerBucketTheLastRepeatingFromTheFirstIteration) {
  // bucket_cap_mb_list: 6 float tensors of 100 bytes; caps 100, 200, then 300.
  std::vector<at::Tensor> p(6, torch::zeros({25}));
  EXPECT_EQ(ddp::compute_bucket_assignment(p, reversed(6), std::vector<int64_t>{100, 200, 300}),
            (Buckets{{5}, {4, 3}, {2, 1, 0}}));
  // The first iteration packs by the limits too (by_limits), else one bucket per dtype.
  EXPECT_EQ(ddp::initial_bucket_assignment(p, std::vector<int64_t>{100, 200, 300}, true).size(), 3u);
  EXPECT_EQ(ddp::initial_bucket_assignment(p, std::vector<int64_t>{100, 200, 300}, false).size(), 1u);
}
