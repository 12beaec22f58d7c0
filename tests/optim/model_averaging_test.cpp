// Post-local SGD's parts in one process, over test doubles of the process
// group: the averagers and dist::new_subgroups refuse what PyTorch's refuse
// (a UsageError for its ValueError) before any collective, average at the
// steps PyTorch's do, and PostLocalSGDOptimizer keeps the averager's step
// through save and load. Their results against PyTorch's are the ported
// tests' (tests/parallel/ported/post_local_sgd.cpp).
#include <gtest/gtest.h>

#include <sstream>

#include "../support/fake_process_group.h"
#include "../support/warning_capture.h"
#include "ddp/comm/dist.h"
#include "ddp/optim/model_averaging.h"
#include "ddp/optim/post_local_sgd_optimizer.h"

using ddp::HierarchicalModelAverager;
using ddp::PeriodicModelAverager;
using ddp::PostLocalSGDOptimizer;
using ddp::testing::FakeGroup;
using ddp::testing::WarningCapture;

namespace {

// A group of four with no peers behind it: anything beyond the checks (a
// subgroup, a collective) fails, and not with a UsageError.
std::shared_ptr<ddp::ProcessGroup> four() { return std::make_shared<FakeGroup>(0, 4, FakeGroup::Collectives::refused); }
std::shared_ptr<ddp::ProcessGroup> one() { return std::make_shared<FakeGroup>(0, 1); }

std::string usage_error(const std::function<void()>& make) {
  try {
    make();
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

std::string hierarchy_error(std::vector<std::pair<int64_t, int>> levels, int64_t warmup_steps = 0) {
  return usage_error([&] { HierarchicalModelAverager(levels, warmup_steps, four()); });
}

#define EXPECT_SAYS(message, words) EXPECT_NE((message).find(words), std::string::npos) << (message)

}  // namespace

TEST(PeriodicModelAverager, PeriodBelowOneAndNegativeWarmupAreUsageErrors) {
  EXPECT_SAYS(usage_error([] { PeriodicModelAverager(0, 0, four()); }), "period is 0");
  EXPECT_SAYS(usage_error([] { PeriodicModelAverager(-2, 0, four()); }), "period is -2");
  EXPECT_SAYS(usage_error([] { PeriodicModelAverager(4, -1, four()); }), "warmup_steps is -1");
  EXPECT_EQ(usage_error([] { PeriodicModelAverager(4, 0, four()); }), "");
}

TEST(PeriodicModelAverager, PeriodOneWarnsThatDDPAloneSuffices) {
  WarningCapture warnings;
  PeriodicModelAverager averager(1, 0, four());
  EXPECT_TRUE(warnings.saw("When period is 1, no need to use model averaging"));
}

TEST(PeriodicModelAverager, AveragesEveryPeriodFromTheWarmupOnAndCountsEveryStep) {
  PeriodicModelAverager averager(2, 3, one());
  auto p = torch::ones({3}, torch::requires_grad());
  p.mutable_grad() = torch::zeros({3});
  std::vector<int64_t> averaged;
  for (int64_t s = 0; s < 9; ++s) {
    const void* before = p.data_ptr();
    averager.average_parameters(std::vector<at::Tensor>{p});
    if (p.data_ptr() != before) averaged.push_back(s);  // averaging makes p a view of a new buffer
  }
  EXPECT_EQ(averaged, (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(averager.step, 9);
  EXPECT_TRUE(torch::equal(p, torch::ones({3})));
}

TEST(ModelAveraging, OnlyParametersWithAGradientAreAveraged) {
  auto with = torch::ones({2}, torch::requires_grad()), without = torch::ones({2}, torch::requires_grad());
  with.mutable_grad() = torch::zeros({2});
  const auto params = ddp::get_params_to_average(std::vector<at::Tensor>{without, with});
  ASSERT_EQ(params.size(), 1u);
  EXPECT_TRUE(params[0].is_same(with));
  const void* before = without.data_ptr();
  ddp::average_parameters(params, one());
  EXPECT_EQ(without.data_ptr(), before);
}

TEST(HierarchicalModelAverager, RefusesWhatPyTorchRefusesBeforeMakingAnyGroup) {
  EXPECT_SAYS(hierarchy_error({}), "period_group_size_dict is empty");
  EXPECT_SAYS(hierarchy_error({{0, 2}, {4, 4}}), "period 0 is not positive");
  EXPECT_SAYS(hierarchy_error({{2, 2}, {4, 2}}), "the last group size, 2, must be the size of process_group, 4");
  EXPECT_SAYS(hierarchy_error({{2, 4}}, -1), "warmup_steps is -1");
}

TEST(HierarchicalModelAverager, GroupSizesThatDoNotDivideTheGroupAndPeriodsNotIncreasingAreUsageErrors) {
  EXPECT_SAYS(hierarchy_error({{2, 3}, {4, 4}}), "group size 3 (period 2) must divide the size of process_group, 4");
  EXPECT_SAYS(hierarchy_error({{2, 0}, {4, 4}}), "group size 0");
  EXPECT_SAYS(hierarchy_error({{2, 8}, {4, 4}}), "group size 8");
  // PyTorch assumes increasing periods without checking; out of order, its
  // "largest period that divides the step" is not what it picks.
  EXPECT_SAYS(hierarchy_error({{4, 2}, {2, 4}}), "period 2 follows period 4");
  EXPECT_SAYS(hierarchy_error({{4, 2}, {4, 4}}), "period 4 follows period 4");
}

TEST(HierarchicalModelAverager, LevelsOfTheWholeGroupNeedNoSubgroupAndALargestPeriodOfOneWarns) {
  WarningCapture warnings;
  HierarchicalModelAverager averager({{1, 4}}, 0, four());
  EXPECT_TRUE(warnings.saw("When the maximum period in arg ``period_group_size_dict`` is 1"));
  ASSERT_EQ(averager.period_process_group_dict().size(), 1u);
  EXPECT_EQ(averager.period_process_group_dict()[0].second.process_group(), averager.process_group().process_group());
}

TEST(HierarchicalModelAverager, AveragesFromTheWarmupOnAtStepsAPeriodDivides) {
  HierarchicalModelAverager averager({{2, 1}, {3, 1}}, 4, one());
  auto p = torch::ones({3}, torch::requires_grad());
  p.mutable_grad() = torch::zeros({3});
  std::vector<int64_t> averaged;
  for (int64_t s = 0; s < 10; ++s) {
    const void* before = p.data_ptr();
    averager.average_parameters(std::vector<at::Tensor>{p});
    if (p.data_ptr() != before) averaged.push_back(s);
  }
  EXPECT_EQ(averaged, (std::vector<int64_t>{4, 6, 8, 9}));
}

TEST(NewSubgroups, SizesThatAreNotPositiveOrDoNotDivideTheGroupAreUsageErrors) {
  const ddp::dist::Group group(four());
  EXPECT_SAYS(usage_error([&] { (void)ddp::dist::new_subgroups(0, group); }), "group_size 0 must be positive");
  EXPECT_SAYS(usage_error([&] { (void)ddp::dist::new_subgroups(3, group); }), "group_size 3 must divide the group's size 4");
  EXPECT_SAYS(usage_error([&] { (void)ddp::dist::new_subgroups(8, group); }), "(it exceeds it)");
}

TEST(PostLocalSGDOptimizer, NullOptimizerOrAveragerIsAUsageError) {
  auto p = torch::ones({2}, torch::requires_grad());
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.1));
  EXPECT_SAYS(usage_error([&] { PostLocalSGDOptimizer(nullptr, std::make_shared<PeriodicModelAverager>(2, 0, one())); }),
              "the optimizer to wrap is null");
  EXPECT_SAYS(usage_error([&] { PostLocalSGDOptimizer(sgd, nullptr); }), "the model averager is null");
}

TEST(PostLocalSGDOptimizer, TheAveragersStepTravelsWithTheStateAndItsAbsenceWarnsAndResetsIt) {
  auto p = torch::ones({2}, torch::requires_grad());
  auto averager = std::make_shared<PeriodicModelAverager>(2, 0, one());
  PostLocalSGDOptimizer opt(std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.1)),
                            averager);
  for (int i = 0; i < 5; ++i) {
    p.mutable_grad() = torch::full({2}, 1.0);
    opt.step();
  }
  EXPECT_EQ(averager->step, 5);
  auto bytes = [](const torch::optim::Optimizer& o) {
    torch::serialize::OutputArchive out;
    o.save(out);
    std::ostringstream s;
    out.save_to(s);
    return s.str();
  };
  auto load = [](torch::optim::Optimizer& o, const std::string& b) {
    torch::serialize::InputArchive in;
    std::istringstream s(b);
    in.load_from(s);
    o.load(in);
  };
  const std::string with_step = bytes(opt), without_step = bytes(opt.optim());
  averager->step = 1;
  load(opt, with_step);
  EXPECT_EQ(averager->step, 5);
  WarningCapture warnings;
  load(opt, without_step);
  EXPECT_TRUE(warnings.saw(
      "Loaded state dict does not contain a step counter for an averager. Setting step counter to 0."));
  EXPECT_EQ(averager->step, 0);
}

TEST(PostLocalSGDOptimizer, TheWrappersGroupOptionsReachTheWrappedOptimizerAtEachStep) {
  auto p = torch::ones({2}, torch::requires_grad());
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<at::Tensor>{p}, torch::optim::SGDOptions(0.1));
  PostLocalSGDOptimizer opt(sgd, std::make_shared<PeriodicModelAverager>(2, 0, one()));
  opt.param_groups()[0].options().set_lr(0.5);  // as an LR scheduler does
  p.mutable_grad() = torch::full({2}, 1.0);
  opt.step();
  EXPECT_DOUBLE_EQ(sgd->param_groups()[0].options().get_lr(), 0.5);
  EXPECT_TRUE(torch::allclose(p, torch::full({2}, 0.5)));
}
