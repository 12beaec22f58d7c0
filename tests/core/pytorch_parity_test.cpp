// Our DDP and PyTorch's own DDP (Debian's python3-torch, the same LibTorch
// kernels) train the same deterministic model for 30 steps on 2 ranks and
// must end with the same parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "multiprocess.h"

using namespace ddp::testing;

namespace {
std::vector<float> read_floats(const std::string& path) {
  auto bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}
}  // namespace

TEST(PyTorchParity, SameParametersAfter30StepsAsPyTorchDDP) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed, torch.nn.parallel' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with torch.distributed is not installed (apt-get install python3-torch)";
  char tmpl[] = "/tmp/ddp_parity_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto ours = run_ranks(2, DDP_WORKER, {"parity", "--out", dir}, {{"DDP_TEST_DIR", dir}});
  for (const auto& r : ours) ASSERT_EQ(r.exit_code, 0) << describe(ours);
  auto theirs = run_ranks(2, "/usr/bin/python3", {PARITY_SCRIPT, dir}, {{"DDP_TEST_DIR", dir}});
  for (const auto& r : theirs) ASSERT_EQ(r.exit_code, 0) << describe(theirs);
  for (int rank = 0; rank < 2; ++rank) {
    auto a = read_floats(dir + "/cpp_rank" + std::to_string(rank) + ".bin");
    auto b = read_floats(dir + "/torch_rank" + std::to_string(rank) + ".bin");
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GT(a.size(), 0u);
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    EXPECT_LE(worst, 1e-6) << "rank " << rank << ": largest parameter difference to PyTorch's DDP";
    std::cout << "rank " << rank << ": " << a.size() << " parameters, largest difference to PyTorch DDP " << worst
              << std::endl;
  }
  std::filesystem::remove_all(dir);
}
