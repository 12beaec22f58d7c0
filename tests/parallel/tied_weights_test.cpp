// What DistributedDataParallel tells about tied weights (src/parallel/tied_weights.h),
// in one process: built-in layers whose member was reassigned away from the
// registered tensor, tensors parameters() lists twice, and the advice of the
// no-gradient error.
#include <gtest/gtest.h>

#include "parallel/tied_weights.h"

namespace {

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(bool reassign) {
    emb = register_module("emb", torch::nn::Embedding(10, 4));
    head = register_module("head", torch::nn::Linear(4, 10));
    free = register_parameter("free", torch::ones({3}));
    if (reassign) head->weight = emb->weight;
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor free;
};
TORCH_MODULE(Model);

TEST(TiedWeights, ALinearWeightReassignedToTheEmbeddingIsFound) {
  Model net(true);
  std::vector<std::string> intact;
  const auto found = ddp::detail::reassigned_members(*net, &intact);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].parameter, "head.weight");
  EXPECT_EQ(found[0].member, "head->weight");
  EXPECT_EQ(found[0].now, "'emb.weight'");
  EXPECT_EQ(intact, (std::vector<std::string>{"emb.weight", "head.bias"}));  // "free" is no layer's member
}

TEST(TiedWeights, ATensorThatIsNoParameterIsSaidSo) {
  Model net(false);
  net->head->bias = torch::zeros({10});
  const auto found = ddp::detail::reassigned_members(*net);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].now, "a tensor that is none of the module's parameters");
}

TEST(TiedWeights, AnIntactModelHasNone) {
  Model net(false);
  EXPECT_TRUE(ddp::detail::reassigned_members(*net).empty());
  EXPECT_TRUE(ddp::detail::parameters_listed_twice(*net).empty());
}

TEST(TiedWeights, ATensorRegisteredTwiceIsListedWithItsNames) {
  torch::nn::Sequential seq;
  torch::nn::Linear shared(2, 2);
  seq->push_back(shared);
  seq->push_back(shared);
  EXPECT_EQ(ddp::detail::parameters_listed_twice(*seq),
            (std::vector<std::string>{"'0.weight' (also '1.weight')", "'0.bias' (also '1.bias')"}));
  shared->bias.set_requires_grad(false);  // frozen: an optimizer leaves it alone
  EXPECT_EQ(ddp::detail::parameters_listed_twice(*seq), (std::vector<std::string>{"'0.weight' (also '1.weight')"}));
}

TEST(TiedWeights, TheAdviceNamesTheReassignedMemberAndNotFindUnused) {
  Model net(true);
  const auto advice = ddp::detail::no_gradient_advice(*net, {"head.weight"});
  EXPECT_NE(advice.find("its member head->weight was assigned another tensor (now 'emb.weight')"), std::string::npos)
      << advice;
  EXPECT_NE(advice.find("register_parameter(\"weight\", emb->weight)"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("find_unused_parameters"), std::string::npos) << advice;
}

TEST(TiedWeights, ALayerCheckedIntactLeavesOnlyTheUnusedCause) {
  Model net(false);
  const auto advice = ddp::detail::no_gradient_advice(*net, {"head.weight"});
  EXPECT_EQ(advice.find("member reassigned"), std::string::npos) << advice;
  EXPECT_NE(advice.find("find_unused_parameters(true)"), std::string::npos) << advice;
}

TEST(TiedWeights, AParameterOfNoKnownLayerListsTheReassignedMemberFirst) {
  Model net(false);
  const auto advice = ddp::detail::no_gradient_advice(*net, {"free"});
  const auto member = advice.find("a module member reassigned"), unused = advice.find("find_unused_parameters(true)");
  ASSERT_NE(member, std::string::npos) << advice;
  ASSERT_NE(unused, std::string::npos) << advice;
  EXPECT_LT(member, unused) << advice;
}

TEST(TiedWeights, BothKindsInOneError) {
  Model net(true);
  const auto advice = ddp::detail::no_gradient_advice(*net, {"head.weight", "free"});
  EXPECT_LT(advice.find("now 'emb.weight'"), advice.find("For the other parameters")) << advice;
  EXPECT_NE(advice.find("find_unused_parameters(true)"), std::string::npos) << advice;
}

}  // namespace
