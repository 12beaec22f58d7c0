// Our DDP and PyTorch's own DDP (Debian's python3-torch, the same LibTorch
// kernels) train the same deterministic models for 30 steps, case by case
// (options, bucket layouts, unused parameters, no_sync, BatchNorm buffers,
// tied weights, gradients reset to none), at 2, 3 and 4 ranks, and must end
// with bitwise-identical parameters and buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>

#include "multiprocess.h"

using namespace ddp::testing;

namespace {

const std::vector<std::string> kCases = {"defaults",    "bucket_view", "buckets", "buckets_view", "find_unused",
                                         "no_sync",     "batchnorm",   "tied",    "set_to_none"};

std::vector<float> read_floats(const std::string& path) {
  auto bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

class PyTorchParity : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(PyTorchParity, BitwiseEqualToPyTorchDDPAfter30StepsInEveryCase) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed, torch.nn.parallel' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with torch.distributed is not installed (apt-get install python3-torch)";
  const int world = GetParam();
  char tmpl[] = "/tmp/ddp_parity_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto ours = run_ranks(world, DDP_WORKER, {"parity", "--out", dir}, {{"DDP_TEST_DIR", dir}});
  for (const auto& r : ours) ASSERT_EQ(r.exit_code, 0) << describe(ours);
  auto theirs = run_ranks(world, "/usr/bin/python3", {PARITY_SCRIPT, dir}, {{"DDP_TEST_DIR", dir}});
  for (const auto& r : theirs) ASSERT_EQ(r.exit_code, 0) << describe(theirs);
  std::cout << "world " << world << ": largest |libddp - PyTorch DDP| over parameters and buffers, per case\n";
  for (const auto& c : kCases) {
    double worst = 0;
    size_t differing = 0, total = 0;
    for (int rank = 0; rank < world; ++rank) {
      const auto suffix = c + "_rank" + std::to_string(rank) + ".bin";
      auto a = read_floats(dir + "/cpp_" + suffix);
      auto b = read_floats(dir + "/torch_" + suffix);
      ASSERT_EQ(a.size(), b.size()) << c << ", rank " << rank;
      ASSERT_GT(a.size(), 0u) << c;
      total += a.size();
      for (size_t i = 0; i < a.size(); ++i) {
        // Bitwise: the same float, not merely close.
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
        worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
      }
    }
    std::cout << "  " << std::setw(13) << std::left << c << " values " << total << ", differing " << differing
              << ", largest difference " << worst << std::endl;
    EXPECT_EQ(differing, 0u) << c << " at " << world << " ranks: largest difference " << worst;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, PyTorchParity, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });
