// PowerSGDState without a process group: its options refuse what PyTorch's
// PowerSGDState refuses (with a UsageError for its ValueError) and default
// to PyTorch's values; and the numpy generator that seeds the random Qs
// draws numpy's numbers.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "ddp/parallel/powersgd_hook.h"
#include "parallel/numpy_random.h"

using ddp::hooks::PowerSGDOptions;
using ddp::hooks::PowerSGDState;
using ddp::hooks::detail::numpy_randint;

namespace {

std::string usage_error(const PowerSGDOptions& options) {
  try {
    PowerSGDState state(nullptr, options);
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PowerSGDState, StartingBeforeTheSecondIterationWithErrorFeedbackOrWarmStartIsAUsageError) {
  for (int64_t start : {-1, 0, 1}) {
    const auto both = usage_error(PowerSGDOptions().start_powerSGD_iter(start));
    EXPECT_NE(both.find("start_powerSGD_iter is " + std::to_string(start)), std::string::npos) << both;
    EXPECT_NE(both.find("start_powerSGD_iter(2)"), std::string::npos) << "says what to do: " << both;
    EXPECT_FALSE(usage_error(PowerSGDOptions().start_powerSGD_iter(start).use_error_feedback(false)).empty());
    EXPECT_FALSE(usage_error(PowerSGDOptions().start_powerSGD_iter(start).warm_start(false)).empty());
    // Neither: nothing is remembered across the bucket rebuild, so PyTorch allows it.
    EXPECT_EQ(usage_error(PowerSGDOptions().start_powerSGD_iter(start).use_error_feedback(false).warm_start(false)), "");
  }
  EXPECT_EQ(usage_error(PowerSGDOptions().start_powerSGD_iter(2)), "");
}

TEST(PowerSGDState, RankBelowOneSeedOutsideNumpysRangeAndNegativeEpsilonAreUsageErrors) {
  EXPECT_NE(usage_error(PowerSGDOptions().matrix_approximation_rank(0)).find("matrix_approximation_rank"),
            std::string::npos);
  EXPECT_NE(usage_error(PowerSGDOptions().random_seed(-1)).find("random_seed"), std::string::npos);
  EXPECT_NE(usage_error(PowerSGDOptions().random_seed(int64_t{1} << 32)).find("random_seed"), std::string::npos);
  EXPECT_EQ(usage_error(PowerSGDOptions().random_seed(0xffffffff)), "");
  EXPECT_NE(usage_error(PowerSGDOptions().orthogonalization_epsilon(-1e-8)).find("orthogonalization_epsilon"),
            std::string::npos);
}

TEST(PowerSGDState, DefaultsArePyTorchs) {
  const PowerSGDOptions o;
  EXPECT_EQ(o.matrix_approximation_rank(), 1);
  EXPECT_EQ(o.start_powerSGD_iter(), 1000);
  EXPECT_EQ(o.min_compression_rate(), 2);
  EXPECT_TRUE(o.use_error_feedback());
  EXPECT_TRUE(o.warm_start());
  EXPECT_EQ(o.orthogonalization_epsilon(), 0);
  EXPECT_EQ(o.random_seed(), 0);
  EXPECT_EQ(o.compression_stats_logging_frequency(), 10000);
  EXPECT_FALSE(o.batch_tensors_with_same_shape());
  PowerSGDState state(nullptr);
  EXPECT_EQ(state.iter(), 0);
  EXPECT_EQ(state.compression_stats().compress_rate, 0);  // nothing compressed yet
  EXPECT_EQ(state.compression_stats().numel_before_compression, 0);
  // As PyTorch, max(1, frequency).
  EXPECT_EQ(PowerSGDState(nullptr, PowerSGDOptions().compression_stats_logging_frequency(0))
                .options()
                .compression_stats_logging_frequency(),
            1);
}

// Produced by /usr/bin/python3 (numpy 1.24.2, the one PyTorch 1.13 imports here):
//   r = np.random.RandomState(seed); v = [int(r.randint(1_000_000_000)) for _ in range(10000)]
//   print(seed, v[:3], sum(v), v[-1])
TEST(NumpyRandomState, RandintOfOneBillionDrawsNumpysNumbers) {
  struct Expected {
    uint32_t seed;
    std::array<int64_t, 3> first;
    int64_t sum;
    int64_t last;
  };
  const Expected expected[] = {
      {0, {209652396, 398764591, 924231285}, 5006794983142, 566609123},
      {1, {717354021, 946286476, 784077896}, 4969666723743, 187769487},
      {42, {534895718, 199900595, 862061404}, 4976081070482, 668491299},
      {12345, {771445218, 601959909, 285080861}, 5043961119411, 326824949},
      {4294967295u, {419326371, 479346978, 697429004}, 4986758457143, 695918601},
  };
  for (const auto& e : expected) {
    std::mt19937 rng(e.seed);
    int64_t sum = 0, v = 0;
    for (int i = 0; i < 10000; ++i) {
      v = numpy_randint(rng, 1000000000);
      if (i < 3) EXPECT_EQ(v, e.first[i]) << "seed " << e.seed << ", draw " << i;
      sum += v;
    }
    EXPECT_EQ(sum, e.sum) << "seed " << e.seed;
    EXPECT_EQ(v, e.last) << "seed " << e.seed;
  }
}

// Against numpy itself, where /usr/bin/python3 has it: other seeds, and
// bounds whose masks and rejection rates differ (1, powers of two, just
// above them, 2^32).
TEST(NumpyRandomState, RandintMatchesNumpyAtTestTimeForManyBounds) {
  const std::vector<int64_t> highs = {1, 2, 3, 7, 1000, 1 << 20, (1 << 20) + 1, 1000000000, (int64_t{1} << 31) + 1,
                                      int64_t{1} << 32};
  std::ostringstream script;
  script << "import numpy as np\n"
         << "for seed in (7, 2024, 3000000000):\n"
         << "  r = np.random.RandomState(seed)\n"
         << "  for high in (";
  for (auto h : highs) script << h << ",";
  script << "):\n    print(' '.join(str(int(r.randint(high))) for _ in range(300)))\n";
  const std::string command = "/usr/bin/python3 -c \"" + script.str() + "\" 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  ASSERT_TRUE(pipe);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe.get())) out.append(buf.data(), n);
  if (out.empty()) GTEST_SKIP() << "/usr/bin/python3 with numpy is not installed";
  std::istringstream numpy(out);
  for (uint32_t seed : {7u, 2024u, 3000000000u}) {
    std::mt19937 rng(seed);
    for (auto high : highs)
      for (int i = 0; i < 300; ++i) {
        int64_t expected = -1;
        ASSERT_TRUE(numpy >> expected);
        ASSERT_EQ(numpy_randint(rng, high), expected) << "seed " << seed << ", high " << high << ", draw " << i;
      }
  }
}
