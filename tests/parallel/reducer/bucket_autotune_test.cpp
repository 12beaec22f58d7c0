// bucket_cap_mb("auto")'s search (src/bucket_autotune.*): the order of the
// visits, the warm-up steps, and that the slowest rank's medians decide.
#include <gtest/gtest.h>

#include "../../support/fake_process_group.h"
#include "parallel/reducer/bucket_autotune.h"

namespace {

using Next = ddp::BucketAutotune::Next;

}  // namespace

// Three caps, 1 warm-up and 2 timed steps a visit, two passes: 1, 25, 100,
// 100 (no warm-up: the buckets stay), 25, 1; 17 steps, then agree.
TEST(BucketAutotune, VisitsInOrderThenBackWithWarmUpsWhereTheBucketsChange) {
  ddp::BucketAutotune tune({1, 25, 100}, 1, 2);
  std::vector<std::pair<double, Next>> seen;
  for (int step = 0; step < 17; ++step) {
    const double cap = tune.current_cap_mb();
    seen.emplace_back(cap, tune.after_step(10.0));
  }
  const std::vector<std::pair<double, Next>> expected = {
      {1, Next::keep},   {1, Next::keep},   {1, Next::switch_},     // warm-up, 2 timed
      {25, Next::keep},  {25, Next::keep},  {25, Next::switch_},    //
      {100, Next::keep}, {100, Next::keep}, {100, Next::keep},      // the turn: 100 goes on
      {100, Next::keep}, {100, Next::switch_},                       // without a warm-up
      {25, Next::keep},  {25, Next::keep},  {25, Next::switch_},    //
      {1, Next::keep},   {1, Next::keep},   {1, Next::agree}};
  EXPECT_EQ(seen, expected);
  EXPECT_FALSE(tune.done());
}

// Per candidate the median of this rank's timed steps, then the larger of the
// two ranks' figures: the cap that is cheapest for the slower rank wins.
TEST(BucketAutotune, TheSlowestRanksMedianDecides) {
  ddp::BucketAutotune tune({1, 25}, 1, 1, 2);  // visits 1, 25, 25, 1
  // This rank: cap 1 costs 10 (warm-up 999 ignored), cap 25 costs 20.
  for (double ms : {999.0, 10.0, 999.0, 20.0, 20.0, 999.0, 10.0}) tune.after_step(ms);
  ASSERT_EQ(tune.current_cap_mb(), 1);
  // Rank 0 of two; the other rank reports: cap 1 costs 30, cap 25 costs 25.
  ddp::testing::FakeGroup peer(0, 2);
  peer.peers_report({torch::tensor({30.0f, 25.0f})});
  EXPECT_EQ(tune.agree(peer), 25);
  EXPECT_TRUE(tune.done());
  EXPECT_EQ(tune.current_cap_mb(), 25);
  ASSERT_EQ(tune.trials().size(), 2u);
  EXPECT_FLOAT_EQ(tune.trials()[0].ms, 30);
  EXPECT_FLOAT_EQ(tune.trials()[1].ms, 25);
  EXPECT_EQ(tune.summary(), "1 MB: 30.0 ms, 25 MB: 25.0 ms -> 25 MB");
  EXPECT_EQ(tune.after_step(1.0), Next::keep);  // done: nothing changes any more
}
