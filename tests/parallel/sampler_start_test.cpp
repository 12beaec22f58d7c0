// DistributedSampler::set_start: an epoch resumed at a global position, at
// the same world size or another (an elastic job that lost or gained a node).
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <vector>

#include "ddp/errors.h"
#include "ddp/parallel/distributed_sampler.h"

namespace {

using Options = ddp::DistributedSamplerOptions;

// The epoch's permutation, as every world size sees it.
std::vector<size_t> order(size_t n, Options o, int64_t epoch) {
  ddp::DistributedSampler one(n, 1, 0, o.pad(false).drop_last(false));
  one.set_epoch(epoch);
  return one.indices();
}

std::vector<std::vector<size_t>> shards(size_t n, int world, Options o, int64_t epoch, size_t start) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < world; ++r) {
    ddp::DistributedSampler s(n, world, r, o);
    s.set_epoch(epoch);
    s.set_start(start);
    out.push_back(s.indices());
  }
  return out;
}

std::vector<size_t> slice(const std::vector<size_t>& v, size_t from, size_t count) {
  return std::vector<size_t>(v.begin() + static_cast<std::ptrdiff_t>(from),
                             v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), from + count)));
}

}  // namespace

// Same world, K = k * B * W: the resumed epoch's batches are the
// uninterrupted epoch's batches k, k+1, ..., index for index, with padding
// and with drop_last.
TEST(SamplerStart, AtTheSameWorldSizeTheResumedBatchesAreTheUninterruptedOnes) {
  const size_t n = 103, batch = 5;
  for (int world : {1, 2, 3, 4}) {
    for (auto o : {Options().seed(3), Options().seed(3).drop_last(true), Options().shuffle(false)}) {
      const auto whole = shards(n, world, o, 2, 0);
      for (size_t k = 0; k * batch * static_cast<size_t>(world) <= n; ++k) {
        const size_t start = k * batch * static_cast<size_t>(world);
        const auto resumed = shards(n, world, o, 2, start);
        for (int r = 0; r < world; ++r) {
          const auto expected = slice(whole[static_cast<size_t>(r)], std::min(whole[static_cast<size_t>(r)].size(), k * batch),
                                      whole[static_cast<size_t>(r)].size());
          EXPECT_EQ(resumed[static_cast<size_t>(r)], expected)
              << "world " << world << " rank " << r << " k " << k << " drop_last " << o.drop_last();
          ddp::DistributedSampler s(n, world, r, o);
          s.set_epoch(2);
          s.set_start(start);
          EXPECT_EQ(s.num_samples(), expected.size());
          EXPECT_EQ(s.total_size(), expected.size() * static_cast<size_t>(world));
        }
      }
    }
  }
}

// Another world: positions K.. of the permutation are taken exactly once
// over the new ranks; padding repeats the permutation from its start
// (position 0, 1, ...), drop_last drops the tail of what is left, and
// pad(false) takes the rest exactly once.
TEST(SamplerStart, AtAnotherWorldSizeEveryRemainingPositionIsTakenOnce) {
  const size_t n = 103;
  const auto perm = order(n, Options().seed(7), 1);
  for (size_t start : {0, 36, 40, 100, 102, 103}) {
    for (int world : {1, 2, 3, 4, 5, 8}) {
      const size_t rest = n - start, w = static_cast<size_t>(world);
      struct Case {
        Options o;
        size_t total;
      };
      for (const Case& c : {Case{Options().seed(7), (rest + w - 1) / w * w}, Case{Options().seed(7).drop_last(true), rest / w * w},
                            Case{Options().seed(7).pad(false), rest}}) {
        const auto s = shards(n, world, c.o, 1, start);
        std::map<size_t, int> got, expected;
        for (const auto& shard : s)
          for (size_t i : shard) ++got[i];
        for (size_t p = start; p < start + c.total; ++p) ++expected[perm[p % n]];
        EXPECT_EQ(got, expected) << "start " << start << " world " << world << " drop_last " << c.o.drop_last()
                                 << " pad " << c.o.pad();
        // Strided: rank r takes positions start + r, start + r + W, ...
        for (int r = 0; r < world; ++r)
          for (size_t j = 0; j < s[static_cast<size_t>(r)].size(); ++j)
            ASSERT_EQ(s[static_cast<size_t>(r)][j], perm[(start + static_cast<size_t>(r) + j * w) % n]);
      }
    }
  }
}

TEST(SamplerStart, CopiesShareItAndANewEpochStartsAtZero) {
  ddp::DistributedSampler mine(50, 2, 1);
  ddp::DistributedSampler loaders = mine;  // what make_data_loader keeps
  mine.set_epoch(3);
  mine.set_start(20);
  loaders.reset();
  std::vector<size_t> seen;
  while (auto batch = loaders.next(4)) seen.insert(seen.end(), batch->begin(), batch->end());
  EXPECT_EQ(seen, mine.indices());
  EXPECT_EQ(seen.size(), 15u);
  EXPECT_EQ(loaders.start(), 20u);
  mine.set_epoch(4);
  EXPECT_EQ(loaders.start(), 0u) << "set_epoch resets the start";
  EXPECT_EQ(loaders.num_samples(), 25u);
  mine.set_start(50);
  EXPECT_TRUE(mine.indices().empty()) << "the whole epoch taken";
  EXPECT_THROW(mine.set_start(51), ddp::UsageError);
}

TEST(SamplerStart, TheSamplerArchiveKeepsTheStart) {
  ddp::DistributedSampler a(40, 3, 2);
  a.set_epoch(1);
  a.set_start(9);
  a.reset();
  a.next(2);
  torch::serialize::OutputArchive out;
  a.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  ddp::DistributedSampler b(40, 3, 2);
  b.load(in);
  EXPECT_EQ(b.start(), 9u);
  EXPECT_EQ(b.epoch(), 1);
  const auto all = a.indices();
  EXPECT_EQ(b.next(100).value(), std::vector<size_t>(all.begin() + 2, all.end()));
}
