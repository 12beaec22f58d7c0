// Options refuse values that cannot work where they are set, with a
// ddp::UsageError, before any process group or collective exists. And what
// a program meets around them: our errors' types, and the tensors
// DistributedDataParallel finds in a forward's result.
#include <gtest/gtest.h>

#include "ddp/parallel/ddp_options.h"
#include "ddp/comm/process_group.h"
#include "ddp/errors.h"
#include "ddp/parallel/output_tensors.h"

#include <torch/version.h>

TEST(DistributedDataParallelOptions, ZeroOrNegativeBucketIsAUsageErrorWhereItIsSet) {
  EXPECT_THROW(ddp::DistributedDataParallelOptions().bucket_cap_mb(0), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedDataParallelOptions().bucket_cap_mb(-1), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedDataParallelOptions().first_bucket_mb(-0.5), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedDataParallelOptions().bucket_cap_mb(std::nan("")), ddp::UsageError);
  try {
    ddp::DDPOptions().bucket_cap_mb(0);
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket_cap_mb"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(ddp::DistributedDataParallelOptions().bucket_cap_mb(0.5).bucket_cap_mb(), 0.5);
  EXPECT_DOUBLE_EQ(ddp::DDPOptions().bucket_cap_mb(), 25.0);  // PyTorch's default
}

TEST(DistributedDataParallelOptions, BucketCapListTakesPositiveCapsTheLargestIsTheCapALaterCapReplacesIt) {
  EXPECT_THROW(ddp::DDPOptions().bucket_cap_mb_list({1, 0}), ddp::UsageError);
  EXPECT_THROW(ddp::DDPOptions().bucket_cap_mb_list({-2}), ddp::UsageError);
  EXPECT_THROW(ddp::DDPOptions().bucket_cap_mb_list({std::nan("")}), ddp::UsageError);
  const auto listed = ddp::DDPOptions().bucket_cap_mb_list({1, 4, 2});
  EXPECT_DOUBLE_EQ(listed.bucket_cap_mb(), 4.0);  // PyTorch's max(bucket_cap_mb_list)
  EXPECT_EQ(ddp::bucket_limits_in_effect(listed, listed.bucket_cap_mb()),
            (std::vector<int64_t>{1 << 20, 4 << 20, 2 << 20}));
  EXPECT_TRUE(ddp::DDPOptions().bucket_cap_mb_list({1, 2}).bucket_cap_mb(3).bucket_cap_mb_list().empty());
  EXPECT_TRUE(ddp::DDPOptions().bucket_cap_mb_list({1, 2}).bucket_cap_mb("auto").bucket_cap_mb_list().empty());
  EXPECT_DOUBLE_EQ(ddp::DDPOptions().bucket_cap_mb_list({}).bucket_cap_mb(), 25.0);  // empty: none
  EXPECT_THROW(ddp::bucket_limits_in_effect(ddp::DDPOptions().first_bucket_mb(1).bucket_cap_mb_list({1, 2}), 2),
               ddp::UsageError);
}

TEST(ProcessGroupOptions, UnknownBackendZeroTimeoutAndUnknownInitMethodAreUsageErrors) {
  EXPECT_THROW(ddp::ProcessGroupOptions().backend("glooo"), ddp::UsageError);
  EXPECT_THROW(ddp::ProcessGroupOptions().timeout(std::chrono::milliseconds(0)), ddp::UsageError);
  EXPECT_THROW(ddp::ProcessGroupOptions().init_method("file:///tmp/x"), ddp::UsageError);
  EXPECT_NO_THROW(ddp::ProcessGroupOptions().backend("gloo").init_method("tcp://127.0.0.1:29500"));
  EXPECT_EQ(ddp::ProcessGroupOptions().timeout(), std::chrono::minutes(30));  // PyTorch's default
}

TEST(ProcessGroupOptions, BadPortInInitMethodIsAUsageErrorBeforeAnyConnection) {
  auto options = ddp::ProcessGroupOptions().backend("gloo").init_method("tcp://127.0.0.1:99999");
  EXPECT_THROW(ddp::init_process_group(ddp::LaunchEnv{}, options), ddp::UsageError);
}

// Our errors are LibTorch's too: a program's catch (const c10::Error&) or
// (const std::exception&) sees them, and a communication failure is a
// c10::DistBackendError where LibTorch has that type, as PyTorch 2.x raises.
TEST(Errors, EveryErrorIsACatchableC10ErrorWithoutABacktrace) {
  try {
    ddp::DDPOptions().bucket_cap_mb(0);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(dynamic_cast<const ddp::UsageError*>(&e), nullptr);
    EXPECT_NE(dynamic_cast<const ddp::Error*>(&e), nullptr);
    EXPECT_STREQ(e.what(), e.what_without_backtrace());
    EXPECT_EQ(std::string(e.what()).find("Exception raised from"), std::string::npos) << e.what();
  }
  try {
    throw ddp::CommError("rank 1: gloo allreduce failed");
  } catch (const std::exception& e) {
    EXPECT_STREQ(e.what(), "rank 1: gloo allreduce failed");
  }
#if TORCH_VERSION_MAJOR >= 2
  EXPECT_THROW(throw ddp::CommError("x"), c10::DistBackendError);
#endif
  EXPECT_THROW(throw ddp::DataError("x"), ddp::Error);
  EXPECT_THROW(throw ddp::CheckpointError("x"), c10::Error);
}

namespace {

struct ModelOutput {
  torch::Tensor logits, aux;
  int steps = 0;
};
auto ddp_fields(const ModelOutput& o) { return std::tie(o.logits, o.aux); }

std::vector<int64_t> numels(const std::vector<torch::Tensor>& tensors) {
  std::vector<int64_t> out;
  for (const auto& t : tensors) out.push_back(t.numel());
  return out;
}

}  // namespace

// DistributedDataParallel finds the tensors of a forward's result as
// PyTorch's _find_tensors does, in any nesting; what holds none adds none.
TEST(OutputTensors, AnyNestingOfTuplesPairsContainersOptionalsMapsAndOwnStructs) {
  auto t = [](int64_t n) { return torch::zeros({n}); };
  EXPECT_EQ(numels(ddp::output_tensors(std::make_tuple(t(1), 2.5))), (std::vector<int64_t>{1}));
  EXPECT_EQ(numels(ddp::output_tensors(std::make_tuple(t(1), std::make_pair(t(2), t(3))))),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(numels(ddp::output_tensors(std::make_tuple(t(1), c10::optional<torch::Tensor>(t(4)),
                                                       c10::optional<torch::Tensor>(), std::optional<torch::Tensor>(t(5))))),
            (std::vector<int64_t>{1, 4, 5}));
  std::map<std::string, torch::Tensor> named{{"b", t(7)}, {"a", t(6)}};
  EXPECT_EQ(numels(ddp::output_tensors(std::make_tuple(t(1), t(2), t(3), named))),
            (std::vector<int64_t>{1, 2, 3, 6, 7}));
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> deep{{{"x", t(8)}}, {{"y", t(9)}, {"z", torch::Tensor()}}};
  EXPECT_EQ(numels(ddp::output_tensors(deep)), (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(numels(ddp::output_tensors(ModelOutput{t(10), t(11), 3})), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(numels(ddp::output_tensors(std::vector<ModelOutput>{{t(1), t(2)}, {t(3), torch::Tensor()}})),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(ddp::output_tensors(std::string("text")).empty());
  EXPECT_TRUE(ddp::output_tensors(42).empty());
  // c10::IValue: tuples, lists, dicts; c10::Dict, c10::List, OrderedDict.
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("a", t(2));
  dict.insert("b", c10::ivalue::Tuple::create({t(3), c10::IValue(), c10::IValue(1.5)}));
  c10::List<torch::Tensor> list({t(4), t(5)});
  EXPECT_EQ(numels(ddp::output_tensors(c10::IValue(c10::ivalue::Tuple::create({t(1), dict, list})))),
            (std::vector<int64_t>{1, 2, 3, 4, 5}));
  c10::Dict<std::string, torch::Tensor> typed;
  typed.insert("k", t(6));
  torch::OrderedDict<std::string, torch::Tensor> ordered;
  ordered.insert("o", t(7));
  EXPECT_EQ(numels(ddp::output_tensors(std::make_tuple(typed, list, ordered))), (std::vector<int64_t>{6, 4, 5, 7}));
}
