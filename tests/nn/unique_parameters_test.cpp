// ddp::unique_parameters: each tensor once, in order of first appearance, as
// Python's module.parameters(); LibTorch's parameters() lists a tensor once
// per registration, and its optimizers step it once per listing.
#include <gtest/gtest.h>

#include "ddp/nn/unique_parameters.h"

namespace {

struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    emb = register_module("emb", torch::nn::Embedding(10, 4));
    hidden = register_module("hidden", torch::nn::Linear(4, 4));
    register_module("hidden_again", hidden);  // a layer registered twice
    head_weight = register_parameter("head_weight", emb->weight);  // an output layer tied to the embedding
    head_bias = register_parameter("head_bias", torch::zeros({10}));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    return torch::nn::functional::linear(hidden(hidden(emb(tokens))), head_weight, head_bias);
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear hidden{nullptr};
  torch::Tensor head_weight, head_bias;
};
TORCH_MODULE(Tied);

std::vector<std::string> keys(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [k, v] : named) out.push_back(k);
  return out;
}

TEST(UniqueParameters, EachTensorOnceInOrderOfFirstAppearance) {
  Tied net;
  // LibTorch: the module's own first (head_weight is emb's tensor), then the
  // children depth-first; emb.weight and hidden_again.* repeat tensors.
  ASSERT_EQ(net->parameters().size(), 7u);
  const auto named = ddp::unique_named_parameters(net);
  EXPECT_EQ(keys(named), (std::vector<std::string>{"head_weight", "head_bias", "hidden.weight", "hidden.bias"}));
}

TEST(UniqueParameters, TheSameTensorsAsNamedAndAsParameters) {
  Tied net;
  const auto named = ddp::unique_named_parameters(net);
  const auto tensors = ddp::unique_parameters(net);
  ASSERT_EQ(tensors.size(), named.size());
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(tensors[i].is_same(named[i].second)) << named[i].first;
  EXPECT_TRUE(tensors[0].is_same(net->emb->weight));
}

TEST(UniqueParameters, SharedPointerHolderAndModuleAgree) {
  Tied holder;
  std::shared_ptr<TiedImpl> shared = holder.ptr();
  const torch::nn::Module& plain = *holder;
  EXPECT_EQ(ddp::unique_parameters(shared).size(), 4u);
  EXPECT_EQ(ddp::unique_parameters(plain).size(), 4u);
  EXPECT_EQ(ddp::unique_parameters(plain, /*recurse=*/false).size(), 2u);  // the module's own: head_weight, head_bias
  EXPECT_EQ(keys(ddp::unique_named_parameters(shared, false)), (std::vector<std::string>{"head_weight", "head_bias"}));
}

TEST(UniqueParameters, TensorsSharingStorageAreTwoParameters) {
  // Identity, not storage: PyTorch's rule too.
  struct Views : torch::nn::Module {
    Views() {
      auto base = torch::zeros({4});
      a = register_parameter("a", base);
      b = register_parameter("b", base.detach());  // same storage, another TensorImpl
    }
    torch::Tensor a, b;
  } views;
  EXPECT_EQ(ddp::unique_parameters(views).size(), 2u);
}

// Why the optimizer must not get parameters(): SGD steps a tied weight once
// per listing. lr * grad is what PyTorch's optimizer does.
TEST(UniqueParameters, SgdFromUniqueParametersStepsATiedWeightOnce) {
  torch::manual_seed(3);
  Tied net;
  auto tokens = torch::randint(0, 10, {6}, torch::kLong);
  const auto before = net->emb->weight.detach().clone();
  torch::optim::SGD twice(net->parameters(), 0.5), once(ddp::unique_parameters(net), 0.5);
  net->forward(tokens).pow(2).sum().backward();
  const auto grad = net->emb->weight.grad().clone();
  once.step();
  EXPECT_TRUE(torch::allclose(before - net->emb->weight.detach(), 0.5 * grad));
  {
    torch::NoGradGuard g;
    net->emb->weight.copy_(before);
  }
  twice.step();
  EXPECT_TRUE(torch::allclose(before - net->emb->weight.detach(), 2 * 0.5 * grad));  // LibTorch's trap
}

// LibTorch refuses to register a second "weight" on a layer that has one:
// the way to tie is to register the shared tensor on a module without one.
TEST(UniqueParameters, LibTorchRefusesASecondRegistrationOfTheSameName) {
  torch::nn::Embedding emb(10, 4);
  torch::nn::Linear head(4, 10);
  EXPECT_THROW(head->register_parameter("weight", emb->weight), c10::Error);
}

}  // namespace
