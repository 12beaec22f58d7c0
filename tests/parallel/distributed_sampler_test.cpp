// DistributedSampler: PyTorch's semantics, index for index.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <sstream>

#include "../support/located.h"
#include "../support/python_server.h"
#include "ddp/parallel/distributed_sampler.h"

namespace {

std::vector<std::vector<size_t>> shards(size_t n, int world, ddp::DistributedSamplerOptions o, int64_t epoch = 0) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < world; ++r) {
    ddp::DistributedSampler s(n, world, r, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

}  // namespace

TEST(DistributedSampler, ShardsAreDisjointAndPaddedToEqualCounts) {
  auto s = shards(10, 3, ddp::DistributedSamplerOptions().shuffle(false));
  EXPECT_EQ(s[0], (std::vector<size_t>{0, 3, 6, 9}));
  EXPECT_EQ(s[1], (std::vector<size_t>{1, 4, 7, 0}));  // padded with the first indices again
  EXPECT_EQ(s[2], (std::vector<size_t>{2, 5, 8, 1}));
  auto d = shards(10, 3, ddp::DistributedSamplerOptions().shuffle(false).drop_last(true));
  EXPECT_EQ(d[0], (std::vector<size_t>{0, 3, 6}));
  EXPECT_EQ(d[2], (std::vector<size_t>{2, 5, 8}));
}

TEST(DistributedSampler, WithoutPaddingEverySampleOnceOverAllRanks) {
  for (size_t n : {0, 1, 7, 10, 101}) {
    auto s = shards(n, 4, ddp::DistributedSamplerOptions().pad(false), 3);
    std::multiset<size_t> all;
    for (auto& shard : s) all.insert(shard.begin(), shard.end());
    ASSERT_EQ(all.size(), n);
    EXPECT_EQ(std::set<size_t>(all.begin(), all.end()).size(), n) << "no index twice";
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(ddp::DistributedSampler(n, 4, r, ddp::DistributedSamplerOptions().pad(false)).num_samples(), s[r].size());
  }
}

TEST(DistributedSampler, ShuffleDependsOnSeedAndEpoch) {
  ddp::DistributedSampler a(100, 2, 0), b(100, 2, 0), c(100, 2, 0, ddp::DistributedSamplerOptions().seed(1));
  EXPECT_EQ(a.indices(), b.indices());
  EXPECT_NE(a.indices(), c.indices());
  b.set_epoch(1);
  EXPECT_NE(a.indices(), b.indices());
  a.set_epoch(1);
  EXPECT_EQ(a.indices(), b.indices());
}

TEST(DistributedSampler, CopiesShareTheEpochSoTheLoadersCopyFollows) {
  ddp::DistributedSampler mine(50, 2, 1);
  ddp::DistributedSampler loaders = mine;  // what make_data_loader keeps
  mine.set_epoch(5);
  loaders.reset();
  std::vector<size_t> seen;
  while (auto batch = loaders.next(7)) seen.insert(seen.end(), batch->begin(), batch->end());
  EXPECT_EQ(seen, mine.indices());
  EXPECT_EQ(loaders.epoch(), 5);
}

TEST(DistributedSampler, SameIndicesAsPyTorch) {
  // Whether the interpreter has torch is found, not imported; every case is
  // asked of one interpreter (its import of torch costs more than the cases).
  FILE* probe = ::popen("/usr/bin/python3 -c 'import importlib.util, sys; "
                        "sys.exit(importlib.util.find_spec(\"torch\") is None)' 2>/dev/null",
                        "r");
  if (!probe || ::pclose(probe) != 0) GTEST_SKIP() << "/usr/bin/python3 with torch not available";
  const std::vector<std::tuple<int, int, int, int, int>> cases{
      {10, 3, 0, 0, 0}, {10, 3, 7, 2, 1}, {1000, 2, 42, 5, 0}, {5, 4, 1, 1, 0}, {3, 4, 0, 0, 0}};
  std::vector<std::string> args{"sampler"};
  for (auto [n, w, seed, epoch, drop] : cases)
    for (int v : {n, w, seed, epoch, drop}) args.push_back(std::to_string(v));
  const std::string out = ddp::testing::python_script(PYTHON_CHECKS, args);
  ASSERT_EQ(out.rfind("FAILED", 0), std::string::npos) << out;
  std::istringstream lines(out);
  std::string line;
  for (auto [n, w, seed, epoch, drop] : cases) {
    for (int r = 0; r < w; ++r) {
      ASSERT_TRUE(std::getline(lines, line)) << "case " << n << " " << w << ": no line for rank " << r;
      std::vector<size_t> expected;
      std::istringstream nums(line);
      for (size_t i; nums >> i;) expected.push_back(i);
      ddp::DistributedSampler s(n, w, r, ddp::DistributedSamplerOptions().seed(seed).drop_last(drop));
      s.set_epoch(epoch);
      EXPECT_EQ(s.indices(), expected) << "n " << n << " world " << w << " seed " << seed << " epoch " << epoch
                                       << " drop_last " << drop << " rank " << r;
    }
  }
}
