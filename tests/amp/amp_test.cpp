// Mixed precision: ddp::Autocast and ddp::GradScaler on their own (one
// process: the guard's nesting, the scaler's state machine, arithmetic and
// errors), and under DDP at 2 and 3 ranks against PyTorch 1.13's
// torch.autocast and GradScaler (pytorch_amp_parity.py): the same parameters
// bitwise, the same scale sequence, the same steps skipped on every rank,
// also when only one rank's gradients hold the inf.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cfloat>
#include <filesystem>
#include <limits>

#include "../support/located.h"
#include "ddp/amp/autocast.h"
#include "ddp/errors.h"
#include "ddp/amp/grad_scaler.h"
#include "../support/multiprocess.h"
#include "../support/parity_compare.h"

using namespace ddp::testing;

namespace {

const std::vector<std::string> kAmpCases = {"plain", "autocast", "autocast_batchnorm", "scaler_loss", "scaler_grad"};

class AmpParity : public ::testing::TestWithParam<int> {};

// A one-parameter "model" whose gradient the test sets directly.
struct Fixture {
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt{std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.5)};
  void backward(ddp::GradScaler& scaler, float grad_value) {
    opt.zero_grad();
    scaler.scale((w * grad_value).sum()).backward();
  }
};

}  // namespace

TEST(Autocast, RunsLinearInBfloat16OnCpuAndRestoresTheThreadsStateWhenNested) {
  auto linear = torch::nn::Linear(4, 2);
  auto x = torch::randn({3, 4});
  EXPECT_FALSE(ddp::autocast_enabled(torch::kCPU));
  {
    ddp::Autocast outer(torch::kCPU);
    EXPECT_TRUE(ddp::autocast_enabled(torch::kCPU));
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
    {
      ddp::Autocast off(torch::kCPU, std::nullopt, /*enabled=*/false);
      EXPECT_FALSE(ddp::autocast_enabled(torch::kCPU));
      EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(ddp::autocast_enabled(torch::kCPU));
  }
  EXPECT_FALSE(ddp::autocast_enabled(torch::kCPU));
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(ddp::amp_dtype(torch::Device(torch::kCPU)), torch::kBFloat16);
  EXPECT_EQ(ddp::amp_dtype(torch::Device(torch::kCUDA, 0)), torch::kHalf);
}

// The CUDA switches are thread-local flags too: set and restored without a
// GPU, and CPU operations keep float32 inside a CUDA region.
TEST(Autocast, ACudaRegionSetsOnlyTheCudaSwitchAndRestoresIt) {
  EXPECT_FALSE(ddp::autocast_enabled(torch::kCUDA));
  {
    ddp::Autocast cuda(torch::kCUDA);
    EXPECT_TRUE(ddp::autocast_enabled(torch::kCUDA));
    EXPECT_FALSE(ddp::autocast_enabled(torch::kCPU));
    EXPECT_EQ(torch::nn::Linear(4, 2)(torch::randn({3, 4})).scalar_type(), torch::kFloat);
  }
  EXPECT_FALSE(ddp::autocast_enabled(torch::kCUDA));
}

// As torch.autocast: no dtype means the thread's current one (an outer
// region's), and a region with autocast off takes any dtype.
TEST(Autocast, NoDtypeKeepsTheThreadsAndADisabledRegionTakesAnyDtype) {
  EXPECT_EQ(ddp::autocast_dtype(torch::kCUDA), torch::kHalf);
  {
    ddp::Autocast outer(torch::kCUDA, torch::kBFloat16);
    ddp::Autocast inner(torch::kCUDA);
    EXPECT_EQ(ddp::autocast_dtype(torch::kCUDA), torch::kBFloat16);
  }
  EXPECT_EQ(ddp::autocast_dtype(torch::kCUDA), torch::kHalf);
  EXPECT_NO_THROW(ddp::Autocast(torch::kCPU, torch::kFloat, /*enabled=*/false));
}

TEST(Autocast, GradientsOfFloat32ParametersStayFloat32) {
  auto linear = torch::nn::Linear(4, 2);
  torch::Tensor loss;
  {
    ddp::Autocast autocast(torch::kCPU);
    loss = linear(torch::randn({3, 4})).sum();
  }
  loss.backward();
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(linear->bias.grad().scalar_type(), torch::kFloat);
}

TEST(Autocast, UnsupportedDeviceOrDtypeIsAUsageError) {
  EXPECT_THROW(ddp::Autocast(torch::kCPU, torch::kFloat), ddp::UsageError);
  EXPECT_THROW(ddp::Autocast(torch::kMeta), ddp::UsageError);
#if TORCH_VERSION_MAJOR < 2
  EXPECT_THROW(ddp::Autocast(torch::kCPU, torch::kHalf), ddp::UsageError);
#endif
  EXPECT_FALSE(ddp::autocast_enabled(torch::kCPU)) << "a refused guard must leave the thread as it was";
}

TEST(GradScaler, ScalesUnscalesAndStepsWithPyTorchsDefaults) {
  Fixture f;
  ddp::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  auto scaled = scaler.scale(torch::tensor(2.0f));
  EXPECT_EQ(scaled.sizes(), torch::IntArrayRef({1})) << "PyTorch's scale is a one-element tensor";
  EXPECT_EQ(scaled.item<float>(), 131072.0f);
  f.backward(scaler, 0.25f);
  EXPECT_EQ(f.w.grad()[0].item<float>(), 0.25f * 65536.0f);
  EXPECT_TRUE(scaler.step(f.opt));
  EXPECT_EQ(f.w.grad()[0].item<float>(), 0.25f) << "step() unscales first";
  EXPECT_EQ(f.w[0].item<float>(), 1.0f - 0.5f * 0.25f);
  scaler.update();
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

TEST(GradScaler, SkipsOnInfOrNanBacksOffAndGrowsAfterTheInterval) {
  Fixture f;
  ddp::GradScaler scaler(ddp::GradScalerOptions().init_scale(1024).growth_interval(2));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // grad value per step -> (stepped, scale after update, tracker)
  const std::vector<std::tuple<float, bool, double, int64_t>> expected = {
      {1, true, 1024, 1}, {1, true, 2048, 0}, {inf, false, 1024, 0}, {nan, false, 512, 0},
      {1, true, 512, 1},  {1, true, 1024, 0}, {1, true, 1024, 1}};
  for (const auto& [g, stepped, scale, tracker] : expected) {
    const auto before = f.w.detach().clone();
    f.backward(scaler, g);
    EXPECT_EQ(scaler.step(f.opt), stepped);
    if (!stepped) EXPECT_TRUE(torch::equal(before, f.w)) << "a skipped step must not touch the parameters";
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), scale);
    EXPECT_EQ(scaler.get_growth_tracker(), tracker);
  }
}

TEST(GradScaler, NeverGrowsPastFloat32AndBacksOffInFloat64Arithmetic) {
  Fixture f;
  const double big = std::numeric_limits<float>::max();
  ddp::GradScaler scaler(ddp::GradScalerOptions().init_scale(big).growth_interval(1).backoff_factor(0.3));
  f.backward(scaler, 0);
  scaler.step(f.opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(std::numeric_limits<float>::max())) << "growth would overflow";
  f.backward(scaler, std::numeric_limits<float>::infinity());
  scaler.step(f.opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(static_cast<float>(static_cast<double>(FLT_MAX) * 0.3)));
}

TEST(GradScaler, StateMachineErrorsAreUsageErrors) {
  Fixture f;
  ddp::GradScaler scaler;
  EXPECT_THROW(scaler.step(f.opt), ddp::UsageError) << "step before any scale()";
  EXPECT_THROW(scaler.update(), ddp::UsageError);
  f.backward(scaler, 1);
  scaler.unscale_(f.opt);
  EXPECT_THROW(scaler.unscale_(f.opt), ddp::UsageError) << "twice in one iteration";
  scaler.step(f.opt);
  EXPECT_THROW(scaler.step(f.opt), ddp::UsageError) << "step twice before update";
  EXPECT_THROW(scaler.unscale_(f.opt), ddp::UsageError) << "unscale_ after step";
  scaler.update();
  EXPECT_THROW(scaler.update(), ddp::UsageError) << "no inf checks since the last update";
  EXPECT_THROW(ddp::GradScaler(ddp::GradScalerOptions().growth_factor(1.0)), ddp::UsageError);
  EXPECT_THROW(ddp::GradScaler(ddp::GradScalerOptions().backoff_factor(1.0)), ddp::UsageError);
  EXPECT_THROW(ddp::GradScaler(ddp::GradScalerOptions().growth_interval(0)), ddp::UsageError);
  EXPECT_THROW(ddp::GradScaler(ddp::GradScalerOptions().init_scale(-1)), ddp::UsageError);
  EXPECT_THROW(scaler.set_growth_factor(0.5), ddp::UsageError);
}

TEST(GradScaler, Float16GradientsAreRefused) {
  auto w = torch::ones({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.1));
  ddp::GradScaler scaler;
  scaler.scale(torch::tensor(1.0f));
  w.mutable_grad() = torch::ones({2}, torch::kHalf);
  EXPECT_THROW(scaler.unscale_(opt), ddp::UsageError);
  // Refused before any gradient is unscaled: a float32 one listed first keeps its value.
  auto f = torch::ones({2}, torch::requires_grad());
  f.mutable_grad() = torch::full({2}, 8.0f);
  torch::optim::SGD both({f, w}, torch::optim::SGDOptions(0.1));
  EXPECT_THROW(scaler.unscale_(both), ddp::UsageError);
  EXPECT_EQ(f.grad()[0].item<float>(), 8.0f);
}

TEST(GradScaler, DisabledPassesThroughAndHasNoState) {
  Fixture f;
  ddp::GradScaler scaler(ddp::GradScalerOptions().enabled(false));
  auto loss = torch::tensor(3.0f);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  f.backward(scaler, 1);
  EXPECT_TRUE(scaler.step(f.opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_FALSE(scaler.state_dict().has_value());
  EXPECT_NO_THROW(scaler.load_state_dict(std::nullopt));
}

TEST(GradScaler, StateDictRoundTripsAndEmptyStateIsRefused) {
  Fixture f;
  ddp::GradScaler a(ddp::GradScalerOptions().init_scale(256).growth_interval(5).growth_factor(3).backoff_factor(0.25));
  for (int i = 0; i < 3; ++i) {
    f.backward(a, i == 1 ? std::numeric_limits<float>::infinity() : 1.0f);
    a.step(f.opt);
    a.update();
  }
  const auto s = a.state_dict();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->scale, 64.0);
  EXPECT_EQ(s->growth_tracker, 1);
  EXPECT_EQ(s->growth_interval, 5);
  ddp::GradScaler b;
  b.load_state_dict(s);
  EXPECT_EQ(b.get_scale(), 64.0);
  EXPECT_EQ(b.get_growth_tracker(), 1);
  EXPECT_EQ(b.get_growth_factor(), 3.0);
  EXPECT_EQ(b.get_backoff_factor(), 0.25);
  EXPECT_EQ(b.scale(torch::tensor(1.0f)).item<float>(), 64.0f) << "the loaded scale is the one used";
  EXPECT_THROW(b.load_state_dict(std::nullopt), ddp::UsageError);
  auto bad = *s;
  bad.backoff_factor = 2;
  EXPECT_THROW(b.load_state_dict(bad), ddp::UsageError);
  bad = *s;
  bad.scale = -1;
  EXPECT_THROW(b.load_state_dict(bad), ddp::UsageError);
  auto underflowed = *s;  // every step overflowed until the scale reached 0: PyTorch saves and loads that
  underflowed.scale = 0;
  EXPECT_NO_THROW(b.load_state_dict(underflowed));
  EXPECT_EQ(b.get_scale(), 0.0);
}

// Our DDP with ddp::Autocast and ddp::GradScaler, and PyTorch's DDP with
// torch.autocast and its GradScaler (pytorch_amp_parity.py): the same kernels
// in the same order, so the same parameters bitwise, and the same scale,
// growth tracker and skipped steps at every step. In scaler_grad only our
// last rank puts the inf/NaN into a gradient (after DDP's all-reduce) while
// every PyTorch rank does: the all-reduced flag makes ours skip on every rank.
TEST_P(AmpParity, AutocastAndGradScalerUnderDdpBitwiseEqualToPyTorch) {
  if (!have_pytorch("torch.distributed, torch.cuda.amp"))
    GTEST_SKIP() << oracle_python() << " with torch.distributed is not installed (apt-get install python3-torch)";
  const int world = GetParam();
  char tmpl[] = "/tmp/ddp_amp_parity_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto ours = run_ranks(world, DDP_WORKER, {"amp_parity", "--out", dir}, {{"DDP_TEST_DIR", dir}});
  for (const auto& r : ours) ASSERT_EQ(r.exit_code, 0) << describe(ours);
  auto theirs = run_ranks(world, oracle_python(), {"-O", AMP_PARITY_SCRIPT, dir, join_commas(kAmpCases)},
                          {{"DDP_TEST_DIR", dir}});
  for (const auto& r : theirs) ASSERT_EQ(r.exit_code, 0) << describe(theirs);
  for (const auto& c : kAmpCases) {
    FloatDiff diff;
    for (int rank = 0; rank < world; ++rank)
      ASSERT_NO_FATAL_FAILURE(diff.add(dir, c + "_rank" + std::to_string(rank) + ".bin"));
    std::cout << "world " << world << " " << c << ": values " << diff.total << ", differing " << diff.differing
              << ", largest difference " << diff.worst << std::endl;
    EXPECT_EQ(diff.differing, 0u) << c << " at " << world << " ranks";
    if (c.rfind("scaler", 0) != 0) continue;
    const auto reference = read_file(dir + "/torch_" + c + "_rank0_scales.txt");
    ASSERT_FALSE(reference.empty());
    EXPECT_NE(reference.find(" 0\n"), std::string::npos) << c << ": the pattern must skip some steps";
    for (int rank = 0; rank < world; ++rank)
      EXPECT_EQ(read_file(dir + "/cpp_" + c + "_rank" + std::to_string(rank) + "_scales.txt"), reference)
          << c << ": rank " << rank << "'s scale sequence (step, scale, growth tracker, stepped)";
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AmpParity, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });
