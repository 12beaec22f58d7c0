// Scenarios of ddp_worker, one per reducer rule: tied weights, a hook
// without gradient on one rank, reentrant backward, a backward that throws,
// buffer broadcasts per accumulation cycle, channels_last bucket views,
// sparse embeddings refused.
#include <chrono>
#include <iostream>
#include <sstream>
#include <thread>

#include "../support/fake_process_group.h"
#include "../support/worker_common.h"
#include "parallel/ddp_internals.h"

namespace ddp::testing {

// The same weight registered twice: a layer applied twice, or an embedding
// tied to the output layer. Gradients must equal the single-process ones.
struct OutputImpl : torch::nn::Module {
  explicit OutputImpl(torch::Tensor tied_weight) {
    weight = register_parameter("weight", tied_weight);
    bias = register_parameter("bias", torch::zeros({tied_weight.size(0)}, torch::kDouble));
  }
  torch::Tensor forward(torch::Tensor h) { return torch::nn::functional::linear(h, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Output);

struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(bool embedding) : embedding(embedding) {
    if (embedding) {
      emb = register_module("emb", torch::nn::Embedding(10, 16));
      emb->to(torch::kDouble);
      hidden = register_module("hidden", torch::nn::Linear(16, 16));
      out = register_module("out", Output(emb->weight));
    } else {
      first = register_module("first", torch::nn::Linear(8, 16));
      hidden = register_module("hidden", torch::nn::Linear(16, 16));
      register_module("hidden_again", hidden);
      last = register_module("last", torch::nn::Linear(16, 4));
    }
    to(torch::kDouble);
  }
  torch::Tensor forward(torch::Tensor x) {
    if (embedding) return out(torch::tanh(hidden(emb(x))));
    auto h = torch::tanh(first(x));
    h = torch::tanh(hidden(torch::tanh(hidden(h))));
    return last(h);
  }
  bool embedding;
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear first{nullptr}, hidden{nullptr}, last{nullptr};
  Output out{nullptr};
};
TORCH_MODULE(Tied);

int scenario_tied(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const bool embedding = flags["--shape"] == "embedding";
  torch::manual_seed(11);
  Tied net(embedding), ref(embedding);
  copy_params(*net, *ref);
  // Buckets of at most one tensor over 104 bytes: the shared weight is alone in one.
  ddp::DistributedDataParallel model(
      net, pg, ddp::DDPOptions().first_bucket_mb(0.0001).bucket_cap_mb(0.0001).gradient_as_bucket_view(
                   flags["--as-view"] != "0"));
  std::vector<torch::Tensor> unique;
  for (auto& [key, p] : unique_parameters(*net)) unique.push_back(p);
  const auto* shared = (embedding ? net->emb->weight : net->hidden->weight).unsafeGetTensorImpl();
  size_t shared_index = 0;
  while (unique[shared_index].unsafeGetTensorImpl() != shared) ++shared_index;
  torch::optim::SGD opt(unique, torch::optim::SGDOptions(0.05).momentum(0.9));
  bool alone = false;
  for (int step = 0; step < 4; ++step) {
    torch::manual_seed(100 + step);
    const int rows = 6 * world;
    auto x = embedding ? torch::randint(0, 10, {rows}, torch::kLong) : torch::randn({rows, 8}, torch::kDouble);
    auto y = torch::randn({rows, embedding ? 10 : 4}, torch::kDouble);
    copy_params(*net, *ref);
    for (auto& p : ref->parameters()) p.mutable_grad() = torch::Tensor();
    torch::mse_loss(ref->forward(x), y).backward();
    opt.zero_grad();
    torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
    expect_grads_close(*net, *ref, "tied step " + std::to_string(step));
    opt.step();
    expect_same_across_ranks(raw, unique, "parameters after step " + std::to_string(step));
    for (const auto& b : ddp::reducer_of(model).bucket_indices()) alone = alone || b == std::vector<size_t>{shared_index};
  }
  EXPECT_OR_FAIL(alone, "the shared weight should sit alone in a bucket");
  return 0;
}

// A custom autograd function whose backward gives no gradient for its weight
// on rank 1 only: that rank's hook fires with an undefined gradient.
struct NoGradOnRankOne : torch::autograd::Function<NoGradOnRankOne> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor w, int64_t rank) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["rank"] = rank;
    return x * w;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto saved = ctx->get_saved_variables();
    const bool none = ctx->saved_data["rank"].toInt() == 1;
    return {grad[0] * saved[1], none ? torch::Tensor() : (grad[0] * saved[0]).sum(0), torch::Tensor()};
  }
};

struct ScaledImpl : torch::nn::Module {
  explicit ScaledImpl(int64_t rank) : rank(rank) {
    l1 = register_module("l1", torch::nn::Linear(8, 32));
    scale = register_parameter("scale", torch::ones({32}));
    l2 = register_module("l2", torch::nn::Linear(32, 32));
    l3 = register_module("l3", torch::nn::Linear(32, 4));
    to(torch::kDouble);
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = NoGradOnRankOne::apply(torch::relu(l1(x)), scale, rank);
    return l3(torch::relu(l2(h)));
  }
  int64_t rank;
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Scaled);

int scenario_undefined_grad(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = raw.rank(), world = raw.size();
  torch::manual_seed(13);
  Scaled net(rank);
  ddp::DistributedDataParallel model(net, pg, tiny_buckets());
  torch::optim::SGD opt(net->parameters(), 0.05);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    opt.zero_grad();
    torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters after step " + std::to_string(step));
  }
  EXPECT_OR_FAIL(model.stats().buckets_rebuilt, "buckets rebuilt after the first iteration");
  EXPECT_OR_FAIL(model.stats().num_buckets >= 3, "several buckets");
  return 0;
}

// Activation checkpointing: forward without a graph, backward recomputes and
// runs a reentrant backward through the layer.
torch::nn::Linear* g_checkpointed = nullptr;
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x) {
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return (*g_checkpointed)(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = (*g_checkpointed)(x);
    }
    torch::autograd::backward({out}, {grad[0]});
    return {x.grad()};
  }
};

int scenario_reentrant(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = raw.rank(), world = raw.size();
  torch::manual_seed(19);
  Net net(false, false), ref(false, false);
  copy_params(*net, *ref);
  g_checkpointed = &net->l3;
  // The checkpointed layer is the last one, so the first hooks of every
  // backward fire inside the reentrant backward.
  struct Wrapped : torch::nn::Module {
    explicit Wrapped(Net n) : net(register_module("net", n)) {}
    torch::Tensor forward(torch::Tensor x) {
      auto h = torch::relu(net->l1(x));
      h = torch::relu(net->l2(h));
      return Checkpoint::apply(h);
    }
    Net net;
  };
  auto wrapped = std::make_shared<Wrapped>(net);
  ddp::DistributedDataParallel model(wrapped, pg, tiny_buckets());
  torch::optim::SGD opt(net->parameters(), 0.05);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    copy_params(*net, *ref);
    ref->zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    opt.zero_grad();
    torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
    expect_grads_close(*net, *ref, "reentrant step " + std::to_string(step));
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters");
  }
  return 0;
}

// A backward that throws after some buckets were launched, on every rank;
// rank 1 reaches those buckets late. Training then goes on: rank 0 must not
// touch its buckets while the failed iteration's all-reduces still run.
struct ThrowAt : torch::autograd::Function<ThrowAt> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, bool fail) {
    ctx->saved_data["fail"] = fail;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    if (ctx->saved_data["fail"].toBool()) throw std::runtime_error("injected failure in backward");
    return {grad[0], torch::Tensor()};
  }
};
struct SleepInBackward : torch::autograd::Function<SleepInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t ms) {
    ctx->saved_data["ms"] = ms;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx->saved_data["ms"].toInt()));
    return {grad[0], torch::Tensor()};
  }
};

int scenario_failed_backward(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = raw.rank(), world = raw.size();
  torch::manual_seed(23);
  Net net(false, false), ref(false, false);
  struct Wrapped : torch::nn::Module {
    explicit Wrapped(Net n) : net(register_module("net", n)) {}
    torch::Tensor forward(torch::Tensor x, bool fail, int64_t sleep_ms) {
      auto h = ThrowAt::apply(torch::relu(net->l1(x)), fail);
      h = torch::relu(net->l2(h));
      return SleepInBackward::apply(net->l3(h), sleep_ms);
    }
    Net net;
  };
  auto wrapped = std::make_shared<Wrapped>(net);
  ddp::DistributedDataParallel model(wrapped, pg, tiny_buckets());
  torch::optim::SGD opt(net->parameters(), 0.05);
  bool failed = false;
  for (int step = 0; step < 8; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    const bool fail = step == 2;
    opt.zero_grad();
    auto loss = torch::mse_loss(model(x.narrow(0, 6 * rank, 6), fail, fail && rank == 1 ? 1500 : 0),
                                y.narrow(0, 6 * rank, 6));
    if (fail) {
      try {
        loss.backward();
      } catch (const std::exception& e) {
        failed = std::string(e.what()).find("injected failure") != std::string::npos;
      }
      EXPECT_OR_FAIL(failed, "the injected failure reached the caller");
      continue;
    }
    loss.backward();
    copy_params(*net, *ref);
    ref->zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    expect_grads_close(*net, *ref, "step " + std::to_string(step));
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters after step " + std::to_string(step));
  }
  return 0;
}

// Buffers follow rank 0 once per accumulation cycle, before the first forward
// after a synchronised one, as PyTorch.
int scenario_buffers_once(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg_ptr) {
  const int rank = raw.rank(), world = raw.size();
  auto counting = std::make_shared<ddp::testing::CountingGroup>(pg_ptr);
  torch::manual_seed(29);
  Net net(false, true);
  // No bucket rebuild (it broadcasts too): only buffer broadcasts are counted.
  ddp::DistributedDataParallel model(net, counting, ddp::DDPOptions().find_unused_parameters(true));
  // sync, no_sync, no_sync, sync, sync, no_sync, sync
  const std::vector<bool> syncs = {true, false, false, true, true, false, true};
  const std::vector<int64_t> expected = {1, 1, 0, 0, 1, 1, 0};
  for (size_t k = 0; k < syncs.size(); ++k) {
    // Not a structured binding: the lambda below captures it, which clang
    // before 16 refuses (C++20); the sanitized build uses clang.
    torch::Tensor x, y;
    std::tie(x, y) = global_batch(static_cast<int>(k), 6 * world);
    const int64_t before = counting->counts().broadcasts;
    auto run = [&] { torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward(); };
    if (syncs[k]) {
      run();
    } else {
      auto guard = model.no_sync();
      run();
    }
    EXPECT_OR_FAIL(counting->counts().broadcasts - before == expected[k],
                   "forward " + std::to_string(k) + ": " + std::to_string(counting->counts().broadcasts - before) +
                       " buffer broadcasts, expected " + std::to_string(expected[k]));
  }
  return 0;
}

// A channels_last weight gets a channels_last gradient (a bucket view with
// the parameter's strides), with the right values.
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    fc = register_module("fc", torch::nn::Linear(8 * 4 * 4, 4));
    to(torch::kDouble);
    torch::NoGradGuard g;
    conv->weight.set_data(conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  torch::Tensor forward(torch::Tensor x) { return fc(torch::relu(conv(x)).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ConvNet);

int scenario_channels_last(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = raw.rank(), world = raw.size();
  torch::manual_seed(31);
  ConvNet net, ref;
  copy_params(*net, *ref);
  EXPECT_OR_FAIL(net->conv->weight.is_contiguous(torch::MemoryFormat::ChannelsLast), "the weight is channels_last");
  ddp::DistributedDataParallel model(net, pg);
  torch::optim::SGD opt(net->parameters(), 0.05);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(200 + step);
    auto x = torch::randn({4 * world, 3, 6, 6}, torch::kDouble).contiguous(torch::MemoryFormat::ChannelsLast);
    auto y = torch::randn({4 * world, 4}, torch::kDouble);
    copy_params(*net, *ref);
    ref->zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    opt.zero_grad();
    torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
    expect_grads_close(*net, *ref, "channels_last step " + std::to_string(step));
    const auto& g = net->conv->weight.grad();
    std::ostringstream strides;
    strides << g.strides() << " vs " << net->conv->weight.strides();
    EXPECT_OR_FAIL(g.strides() == net->conv->weight.strides(), "gradient strides " + strides.str());
    opt.step();
  }
  return 0;
}

// Construction refuses what it cannot reduce, naming the parameter.
int scenario_sparse(std::shared_ptr<ddp::ProcessGroup> pg) {
  struct WithEmbedding : torch::nn::Module {
    WithEmbedding() {
      emb = register_module("emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 4).sparse(true)));
      fc = register_module("fc", torch::nn::Linear(4, 2));
    }
    torch::Tensor forward(torch::Tensor ids) { return fc(emb(ids)); }
    torch::nn::Embedding emb{nullptr};
    torch::nn::Linear fc{nullptr};
  };
  auto net = std::make_shared<WithEmbedding>();
  try {
    ddp::DistributedDataParallel model(net, pg);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find("emb.weight") != std::string::npos, "names the parameter");
    EXPECT_OR_FAIL(what.find("sparse(false)") != std::string::npos, "says what to do");
    EXPECT_OR_FAIL(what.find("rank " + std::to_string(pg->rank())) == 0, "names the rank");
    // The refusal needs no collective, so a rank could exit while another's
    // Gloo group is still connecting to it: meet once before exiting.
    auto done = torch::ones({1});
    pg->allreduce(done).wait();
    return 0;
  }
  throw Fail("a model with a sparse embedding was accepted");
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kReducerScenarios{
    {"tied", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_tied(*pg, pg, flags); }},
    {"undefined_grad", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_undefined_grad(*pg, pg); }},
    {"reentrant", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_reentrant(*pg, pg); }},
    {"failed_backward", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_failed_backward(*pg, pg); }},
    {"buffers_once", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_buffers_once(*pg, pg); }},
    {"channels_last", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_channels_last(*pg, pg); }},
    {"sparse", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_sparse(pg); }}};

}  // namespace ddp::testing
