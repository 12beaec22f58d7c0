// Scenarios of ddp_worker for weights tied in LibTorch: the PyTorch idiom
// (`head->weight = emb->weight`, which LibTorch turns into a member that is
// not the registered parameter) ends the first backward with an error naming
// that cause; a weight tied properly (registered twice) warns once at
// construction, and an optimizer built from ddp::unique_parameters steps it
// once, by lr times the sum of both uses' gradients.
#include <iostream>
#include <string>

#include "../support/worker_common.h"

namespace ddp::testing {
namespace {

// An output layer of our own type, whose weight is whatever it registered:
// the check cannot see its members, only the generic advice applies.
struct OwnHeadImpl : torch::nn::Module {
  explicit OwnHeadImpl(torch::Tensor w) : weight(register_parameter("weight", w)) {}
  torch::Tensor forward(torch::Tensor h) { return torch::nn::functional::linear(h, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(OwnHead);

// Embedding 10 x 16, a hidden layer, and an output layer whose weight is
// (meant to be) the embedding's. `layer`: "linear" (torch::nn::Linear, the
// member reassigned as PyTorch code does), "custom" (OwnHead, its member
// reassigned), "registered" (OwnHead built on emb->weight: tied properly).
struct LanguageModelImpl : torch::nn::Module {
  explicit LanguageModelImpl(const std::string& layer) {
    emb = register_module("emb", torch::nn::Embedding(10, 16));
    hidden = register_module("hidden", torch::nn::Linear(16, 16));
    if (layer == "linear") {
      linear_head = register_module("head", torch::nn::Linear(16, 10));
      linear_head->weight = emb->weight;  // Python's head.weight = emb.weight: only the member changes
    } else {
      own_head = register_module("head", OwnHead(layer == "registered" ? emb->weight : torch::randn({10, 16})));
      if (layer == "custom") own_head->weight = emb->weight;
    }
    to(torch::kDouble);
  }
  torch::Tensor forward(torch::Tensor tokens) {
    auto h = torch::tanh(hidden(emb(tokens)));
    return linear_head ? linear_head(h) : own_head(h);
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear hidden{nullptr}, linear_head{nullptr};
  OwnHead own_head{nullptr};
};
TORCH_MODULE(LanguageModel);

std::pair<torch::Tensor, torch::Tensor> tokens_and_targets(int rows) {
  torch::manual_seed(200);
  return {torch::randint(0, 10, {rows}, torch::kLong), torch::randn({rows, 10}, torch::kDouble)};
}

}  // namespace

// --layer linear|custom: as PyTorch, the first backward leaves the
// reduction unfinished and the next forward fails on every rank, naming
// head.weight and, before find_unused_parameters, the reassigned member.
int scenario_tied_reassigned(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank();
  const std::string layer = flags["--layer"];
  torch::manual_seed(21);
  LanguageModel net(layer);
  ddp::DistributedDataParallel model(net, pg);
  auto [x, y] = tokens_and_targets(4 * pg->size());
  try {
    for (int step = 0; step < 2; ++step)
      torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find("received no gradient") != std::string::npos, "the no-gradient error");
    EXPECT_OR_FAIL(what.find("'head.weight'") != std::string::npos, "names the parameter");
    const auto tie = what.find("register_parameter(\"weight\", emb->weight)");
    EXPECT_OR_FAIL(tie != std::string::npos, "says how to tie in LibTorch");
    if (layer == "linear") {
      // Detected: the built-in layer's member is another registered tensor.
      EXPECT_OR_FAIL(what.find("its member head->weight was assigned another tensor (now 'emb.weight')") !=
                         std::string::npos, "names the member and what it is now");
      EXPECT_OR_FAIL(what.find("find_unused_parameters") == std::string::npos,
                     "no find_unused_parameters advice, which would hide the cause");
    } else {
      // Not detectable in a type of the user's own: listed first among the likely causes.
      const auto member = what.find("a module member reassigned");
      const auto unused = what.find("find_unused_parameters(true)");
      EXPECT_OR_FAIL(member != std::string::npos && unused != std::string::npos && member < unused,
                     "the reassigned member comes before find_unused_parameters");
      EXPECT_OR_FAIL(what.find("now 'emb.weight'") == std::string::npos, "claims nothing it cannot know");
    }
    return 0;
  }
  throw Fail("the forward after a backward with a reassigned member did not fail");
}

// A weight registered twice (embedding and output layer): rank 0 warns once
// at construction (the test counts it in each rank's output), and one SGD
// step from ddp::unique_parameters moves it by lr times the single-process
// gradient of the whole batch, the sum of both uses.
int scenario_tied_step(std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  torch::manual_seed(23);
  LanguageModel net("registered"), ref("registered");
  // emb.weight, hidden.weight, hidden.bias, head.weight (emb's tensor again)
  EXPECT_OR_FAIL(net->parameters().size() == 4, "LibTorch lists the tied weight twice");
  ddp::DistributedDataParallel model(net, pg);
  std::cout << "rank " << rank << ": constructed" << std::endl;
  auto params = ddp::unique_parameters(net);
  EXPECT_OR_FAIL(params.size() == 3, "unique_parameters lists it once");
  const double lr = 0.1;
  torch::optim::SGD opt(params, lr);

  copy_params(*net, *ref);
  const auto before = net->emb->weight.detach().clone();
  auto [x, y] = tokens_and_targets(4 * world);
  torch::mse_loss(ref->forward(x), y).backward();
  const auto g = ref->emb->weight.grad();
  // The reference's gradient has both uses in it: the output layer's part alone is not it.
  EXPECT_OR_FAIL(g.defined() && ref->own_head->weight.grad().equal(g), "one tensor, one gradient");

  opt.zero_grad();
  torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
  opt.step();
  const auto moved = before - net->emb->weight.detach();
  EXPECT_OR_FAIL(torch::allclose(moved, lr * g, 1e-6, 1e-9),
                 "the tied weight moved by " + std::to_string(moved.abs().sum().item<double>()) + ", not lr * grad (" +
                     std::to_string((lr * g).abs().sum().item<double>()) + ")");
  EXPECT_OR_FAIL(net->own_head->weight.is_same(net->emb->weight), "still one tensor");
  expect_same_across_ranks(*pg, params, "parameters after the step");
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kTiedWeightsScenarios{
    {"tied_reassigned", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_tied_reassigned(pg, flags); }},
    {"tied_step", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_tied_step(pg); }}};

}  // namespace ddp::testing
