// ddp::SyncBatchNorm and ddp::convert_sync_batchnorm. In one process, with
// a group that refuses every collective: conversion keeps names, tensors,
// options and modes, reaches Sequential, ModuleList and ModuleDict entries,
// refuses a typed member; evaluation and a group of one are plain
// BatchNorm. Over 2 and 3 real ranks (ddp_worker's sync_bn_* scenarios):
// training equals BatchNorm on the concatenated batch, uneven and empty
// ranks included, and under DDP with several buckets.
#include <gtest/gtest.h>

#include "../support/fake_process_group.h"
#include "../support/located.h"
#include "../support/multiprocess.h"
#include "ddp/nn/sync_batch_norm.h"

using namespace ddp::testing;
namespace nn = torch::nn;

namespace {

// A group of `size` ranks in which any collective is a test failure.
std::shared_ptr<ddp::ProcessGroup> no_collectives(int size) {
  return std::make_shared<ddp::testing::FakeGroup>(0, size, ddp::testing::FakeGroup::Collectives::refused);
}

// Sequential, ModuleList, ModuleDict and a plain registered child.
struct NestedImpl : nn::Module {
  NestedImpl() {
    seq = register_module("seq", nn::Sequential(nn::Linear(4, 6), nn::BatchNorm1d(nn::BatchNormOptions(6).momentum(c10::nullopt))));
    list = register_module("list", nn::ModuleList(nn::BatchNorm2d(nn::BatchNormOptions(2).affine(false)), nn::ReLU()));
    dict = register_module("dict", nn::ModuleDict(torch::OrderedDict<std::string, std::shared_ptr<nn::Module>>(
                                       {{"norm", nn::BatchNorm3d(nn::BatchNormOptions(5).eps(1e-3).track_running_stats(false)).ptr()}})));
    inner = register_module("inner", nn::ModuleList(nn::Sequential(nn::BatchNorm1d(6))));
  }
  nn::Sequential seq{nullptr};
  nn::ModuleList list{nullptr}, inner{nullptr};
  nn::ModuleDict dict{nullptr};
};
TORCH_MODULE(Nested);

// resnet18.h's Residual pattern: named layers in the Sequential it derives
// from, called through its AnyModule entries.
struct ConvBnImpl : nn::SequentialImpl {
  ConvBnImpl() {
    push_back("conv", nn::Conv2d(nn::Conv2dOptions(1, 2, 3)));
    push_back("bn", nn::BatchNorm2d(2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return begin()[1].forward(begin()[0].forward(x)); }
};
TORCH_MODULE(ConvBn);

struct TypedMemberImpl : nn::Module {
  TypedMemberImpl() : fc(register_module("fc", nn::Linear(3, 3))), bn(register_module("bn", nn::BatchNorm1d(3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  nn::Linear fc;
  nn::BatchNorm1d bn;
};
TORCH_MODULE(TypedMember);

std::map<std::string, torch::Tensor> state(const nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value();
  return out;
}

}  // namespace

TEST(SyncBatchNorm, HasBatchNormsNamesAndDefaults) {
  auto pg = no_collectives(2);
  ddp::SyncBatchNorm sync(ddp::SyncBatchNormOptions(4), pg);
  nn::BatchNorm2d bn(4);
  auto ours = state(*sync), theirs = state(*bn);
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& [name, t] : theirs) {
    ASSERT_TRUE(ours.count(name)) << name;
    EXPECT_TRUE(torch::equal(ours[name], t)) << name;
    EXPECT_EQ(ours[name].requires_grad(), t.requires_grad()) << name;
  }
  ddp::SyncBatchNorm plain(ddp::SyncBatchNormOptions(4).affine(false).track_running_stats(false), pg);
  EXPECT_TRUE(plain->named_parameters().is_empty());
  EXPECT_TRUE(plain->named_buffers().is_empty());
  EXPECT_NE(c10::str(*sync).find("SyncBatchNorm(4"), std::string::npos);
}

TEST(SyncBatchNorm, EvaluationAndAGroupOfOneArePlainBatchNormWithoutCollectives) {
  for (int size : {1, 4}) {
    for (bool training : {true, false}) {
      if (training && size > 1) continue;  // training with peers communicates
      torch::manual_seed(1);
      auto x = torch::randn({6, 3, 5}) * 2 + 1;
      nn::BatchNorm1d bn(nn::BatchNormOptions(3).momentum(c10::nullopt));
      ddp::SyncBatchNorm sync(ddp::SyncBatchNormOptions(3).momentum(c10::nullopt), no_collectives(size));
      {
        torch::NoGradGuard no_grad;
        bn->running_mean.fill_(0.5), sync->running_mean.fill_(0.5);
        bn->running_var.fill_(2), sync->running_var.fill_(2);
      }
      bn->train(training);
      sync->train(training);
      for (int step = 0; step < 2; ++step) EXPECT_TRUE(torch::equal(sync(x), bn(x))) << size << training;
      EXPECT_TRUE(torch::equal(sync->running_mean, bn->running_mean));
      EXPECT_TRUE(torch::equal(sync->running_var, bn->running_var));
      EXPECT_TRUE(torch::equal(sync->num_batches_tracked, bn->num_batches_tracked));
    }
  }
}

TEST(ConvertSyncBatchnorm, ReplacesEveryBatchNormSharingTensorsOptionsAndModes) {
  auto pg = no_collectives(2);
  Nested model;
  model->list[0]->eval();
  model->seq[1]->as<nn::BatchNorm1d>()->weight.requires_grad_(false);
  std::map<std::string, const void*> before;
  for (const auto& [name, t] : state(*model)) before[name] = t.unsafeGetTensorImpl();
  std::map<std::string, nn::BatchNormOptions> options;
  for (const auto& item : model->named_modules()) {
    if (auto* b1 = item.value()->as<nn::BatchNorm1d>()) options.emplace(item.key(), b1->options);
    if (auto* b2 = item.value()->as<nn::BatchNorm2d>()) options.emplace(item.key(), b2->options);
    if (auto* b3 = item.value()->as<nn::BatchNorm3d>()) options.emplace(item.key(), b3->options);
  }
  ASSERT_EQ(options.size(), 4u) << c10::str(*model);

  ddp::convert_sync_batchnorm(model, pg);

  // The same names, on the very same tensors.
  const auto after = state(*model);
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, t] : after) EXPECT_EQ(t.unsafeGetTensorImpl(), before.at(name)) << name;
  for (const auto& [path, o] : options) {
    auto module = model->named_modules()[path];
    auto* sync = module->as<ddp::SyncBatchNorm>();
    ASSERT_NE(sync, nullptr) << path;
    EXPECT_EQ(sync->options.num_features(), o.num_features()) << path;
    EXPECT_EQ(sync->options.eps(), o.eps()) << path;
    EXPECT_EQ(sync->options.momentum(), o.momentum()) << path;
    EXPECT_EQ(sync->options.affine(), o.affine()) << path;
    EXPECT_EQ(sync->options.track_running_stats(), o.track_running_stats()) << path;
    EXPECT_EQ(sync->process_group(), pg);
  }
  EXPECT_FALSE(model->named_modules()["list.0"]->is_training());
  EXPECT_TRUE(model->named_modules()["seq.1"]->is_training());
  EXPECT_FALSE(model->named_parameters()["seq.1.weight"].requires_grad());
  EXPECT_TRUE(model->named_parameters()["seq.1.bias"].requires_grad());
  // The containers' own entries, which their forward and at<>() use.
  EXPECT_NE(model->seq->ptr(1)->as<ddp::SyncBatchNorm>(), nullptr);
  EXPECT_NE(model->list->ptr(0)->as<ddp::SyncBatchNorm>(), nullptr);
  EXPECT_NE(model->dict["norm"]->as<ddp::SyncBatchNorm>(), nullptr);
  // A Sequential's forward runs the new layer: in training it asks the group
  // for an all-gather (which this one refuses); in evaluation it needs none.
  EXPECT_THROW(model->seq->forward(torch::randn({2, 4})), std::logic_error);
  model->seq->eval();
  EXPECT_EQ(model->seq->forward(torch::randn({2, 4})).size(1), 6);
}

TEST(ConvertSyncBatchnorm, ReachesLayersOfASequentialSubclassCalledThroughItsEntries) {
  auto pg = no_collectives(2);
  ConvBn model;
  const auto names = model->named_parameters().keys();
  ddp::convert_sync_batchnorm(model, pg);
  EXPECT_EQ(model->named_parameters().keys(), names);
  EXPECT_NE(model->named_children()["bn"]->as<ddp::SyncBatchNorm>(), nullptr);
  EXPECT_THROW(model(torch::randn({2, 1, 5, 5})), std::logic_error);  // the all-gather: synchronised
}

TEST(ConvertSyncBatchnorm, ABatchNormRootBecomesANewLayer) {
  auto pg = no_collectives(2);
  nn::BatchNorm2d bn(3);
  auto converted = ddp::convert_sync_batchnorm(bn.ptr(), pg);
  ASSERT_NE(converted->as<ddp::SyncBatchNorm>(), nullptr);
  EXPECT_EQ(converted->named_parameters()["weight"].unsafeGetTensorImpl(), bn->weight.unsafeGetTensorImpl());
  EXPECT_THROW(ddp::convert_sync_batchnorm(bn, pg), ddp::UsageError);
}

TEST(ConvertSyncBatchnorm, RefusesATypedMemberBeforeChangingAnything) {
  auto pg = no_collectives(2);
  TypedMember model;
  try {
    ddp::convert_sync_batchnorm(model, pg);
    FAIL() << "no error";
  } catch (const ddp::UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0/2"), std::string::npos) << what;
    EXPECT_NE(what.find("'bn'"), std::string::npos) << what;
    EXPECT_NE(what.find("ddp::SyncBatchNorm"), std::string::npos) << what;
  }
  EXPECT_NE(model->named_children()["bn"]->as<nn::BatchNorm1d>(), nullptr);
  // A reference kept by the caller is refused the same way.
  nn::Sequential seq(nn::Linear(2, 2));
  nn::BatchNorm1d kept(2);
  seq->push_back(kept);
  EXPECT_THROW(ddp::convert_sync_batchnorm(seq, pg), ddp::UsageError);
}

TEST(SyncBatchNorm, BadInputIsAUsageErrorNamingTheRank) {
  ddp::SyncBatchNorm sync(ddp::SyncBatchNormOptions(3), no_collectives(2));
  EXPECT_THROW(sync(torch::randn({4})), ddp::UsageError);
  EXPECT_THROW(sync(torch::randn({4, 2})), ddp::UsageError);
}

// ---- over real ranks ------------------------------------------------------

class SyncBatchNormRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(SyncBatchNormRanks, EqualsBatchNormOnTheConcatenatedBatch) {
  const std::string batches = GetParam();
  const int world = static_cast<int>(std::count(batches.begin(), batches.end(), ',')) + 1;
  auto results = run_ranks(world, DDP_WORKER, {"sync_bn_definition", "--batches", batches});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  std::cout << results[0].output;
}

TEST_P(SyncBatchNormRanks, TrainsUnderDDPAsOneProcessOnTheWholeBatch) {
  const std::string batches = GetParam();
  const int world = static_cast<int>(std::count(batches.begin(), batches.end(), ',')) + 1;
  auto results = run_ranks(world, DDP_WORKER, {"sync_bn_ddp", "--batches", batches});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  std::cout << results[0].output;
}

TEST(SyncBatchNorm, TrainsUnderDDPWithFindUnusedParameters) {
  auto results = run_ranks(3, DDP_WORKER, {"sync_bn_ddp", "--batches", "3,5,2", "--find-unused", "1"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  std::cout << results[0].output;
}

INSTANTIATE_TEST_SUITE_P(Batches, SyncBatchNormRanks, ::testing::Values("3,5", "3,5,2", "4,0,3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ',', '_');
                           return "batches_" + name;
                         });

TEST(SyncBatchNorm, BadInputFailsOnEveryRankWithoutACollective) {
  auto results = run_ranks(2, DDP_WORKER, {"sync_bn_errors"});
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
}
