// One rank of a multi-process DDP test. Started by the tests (through
// multiprocess.h) with torchrun's variables; checks its own results and exits
// 0 on success, 1 with a message otherwise. The scenario is argv[1].
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "counting_process_group.h"
#include "ddp/ddp.h"

using namespace std::chrono_literals;

namespace {

std::map<std::string, std::string> parse_flags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  return flags;
}

struct Fail : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define EXPECT_OR_FAIL(cond, msg)                                                           \
  do {                                                                                      \
    if (!(cond)) throw Fail(std::string("check failed: ") + #cond + ": " + std::string(msg)); \
  } while (0)

// Linear layers, optionally with a float and a double part, a BatchNorm in
// front, and an extra layer that only some ranks use.
struct NetImpl : torch::nn::Module {
  NetImpl(bool mixed, bool batchnorm, int out = 4, bool with_extra = false, bool reversed = false)
      : mixed(mixed), use_bn(batchnorm) {
    if (use_bn) bn = register_module("bn", torch::nn::BatchNorm1d(8));
    if (reversed) {
      // Registered in the order gradients become ready: the initial bucket
      // guess (reverse registration) is wrong, so the rebuild must reorder.
      l3 = register_module("l3", torch::nn::Linear(32, out));
      l2 = register_module("l2", torch::nn::Linear(32, 32));
      l1 = register_module("l1", torch::nn::Linear(8, 32));
    } else {
      l1 = register_module("l1", torch::nn::Linear(8, 32));
      l2 = register_module("l2", torch::nn::Linear(32, 32));
      l3 = register_module("l3", torch::nn::Linear(32, out));
    }
    if (with_extra) extra = register_module("extra", torch::nn::Linear(8, out));
    if (mixed) {
      l1->to(torch::kFloat);
      l2->to(torch::kDouble);
      l3->to(torch::kDouble);
      if (extra) extra->to(torch::kDouble);
    } else {
      to(torch::kDouble);
    }
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra = false) {
    if (use_bn) x = bn(x);
    auto h = torch::relu(l1(mixed ? x.to(torch::kFloat) : x));
    h = torch::relu(l2(h.to(torch::kDouble)));
    auto y = l3(h);
    if (use_extra) y = y + extra(x.to(torch::kDouble));
    return y;
  }
  bool mixed, use_bn;
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, extra{nullptr};
};
TORCH_MODULE(Net);

// The global batch of step `step` (the same on every rank), and this rank's rows.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int rows) {
  torch::manual_seed(1000 + step);
  return {torch::randn({rows, 8}, torch::kDouble), torch::randn({rows, 4}, torch::kDouble)};
}

void copy_params(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto src = from.named_parameters(true);
  for (auto& p : to.named_parameters(true)) p.value().copy_(src[p.key()]);
  auto bsrc = from.named_buffers(true);
  for (auto& b : to.named_buffers(true)) b.value().copy_(bsrc[b.key()]);
}

void expect_same_across_ranks(ddp::ProcessGroup& pg, const std::vector<torch::Tensor>& tensors, const std::string& what) {
  std::vector<torch::Tensor> flat;
  for (auto& t : tensors) flat.push_back(t.detach().to(torch::kDouble).reshape(-1));
  auto mine = torch::cat(flat);
  auto all = pg.allgather(mine);
  for (int r = 0; r < pg.size(); ++r)
    EXPECT_OR_FAIL(torch::equal(all[r], all[0]), what + " differ between rank " + std::to_string(r) + " and rank 0");
}

void expect_grads_close(torch::nn::Module& ddp_model, torch::nn::Module& ref, const std::string& when,
                        bool with_extra = false) {
  auto ref_params = ref.named_parameters(true);
  for (auto& p : ddp_model.named_parameters(true)) {
    if (!with_extra && p.key().rfind("extra", 0) == 0) continue;
    auto g = p.value().grad();
    auto r = ref_params[p.key()].grad();
    EXPECT_OR_FAIL(g.defined() && r.defined(), when + ": gradient of " + p.key() + " is missing");
    auto diff = (g.to(torch::kDouble) - r.to(torch::kDouble)).abs().max().item<double>();
    bool close = torch::allclose(g.to(torch::kDouble), r.to(torch::kDouble), 1e-6, 1e-9);
    EXPECT_OR_FAIL(close, when + ": gradient of " + p.key() + " differs from the single-process gradient by " +
                              std::to_string(diff));
  }
}

// Each rank's gradients equal the single-process gradients of the
// concatenated batch; parameters stay identical over the steps.
int scenario_grads(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                   std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const bool mixed = flags["--mixed"] == "1";
  const int steps = flags.count("--steps") ? std::stoi(flags["--steps"]) : 20;
  const int per_rank = 6;
  auto counting = std::make_shared<ddp::testing::CountingProcessGroup>(pg_ptr);
  // Rank-skewed initial weights: DDP must make every rank take rank 0's.
  torch::manual_seed(flags["--skew"] == "1" ? 17 + rank : 17);
  const bool reversed = flags["--reversed"] == "1";
  Net net(mixed, false, 4, false, reversed);
  Net ref(mixed, false, 4, false, reversed);
  auto options = ddp::DDPOptions()
                     .bucket_cap_mb(flags.count("--bucket-cap-mb") ? std::stod(flags["--bucket-cap-mb"]) : 25.0)
                     .first_bucket_mb(flags.count("--first-bucket-mb") ? std::stod(flags["--first-bucket-mb"]) : 1.0)
                     .gradient_as_bucket_view(flags["--as-view"] != "0");
  ddp::DistributedDataParallel model(net, counting, options);
  expect_same_across_ranks(raw, net->parameters(), "initial parameters");
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto initial_buckets = model.reducer().bucket_indices();
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, per_rank * world);
    copy_params(*net, *ref);
    ref->zero_grad();
    torch::mse_loss(ref->forward(x), y).backward();
    if (flags["--set-to-none"] == "1") {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();  // LibTorch 2.x's zero_grad()
    } else {
      opt.zero_grad();
    }
    const int64_t before = counting->allreduces;
    auto loss = torch::mse_loss(model(x.narrow(0, rank * per_rank, per_rank)), y.narrow(0, rank * per_rank, per_rank));
    loss.backward();
    EXPECT_OR_FAIL(counting->allreduces - before == static_cast<int64_t>(model.stats().num_buckets),
                   "one all-reduce per bucket");
    expect_grads_close(*net, *ref, "step " + std::to_string(step));
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters after step " + std::to_string(step));
  }
  const auto& s = model.stats();
  std::cout << "rank " << rank << ": buckets=" << s.num_buckets << " rebuilt=" << s.buckets_rebuilt
            << " bytes=" << s.bytes_reduced << " exposed_ms=" << s.exposed_comm_ms << std::endl;
  if (flags.count("--min-buckets"))
    EXPECT_OR_FAIL(s.num_buckets >= std::stoul(flags["--min-buckets"]), "expected several buckets");
  if (steps >= 2) EXPECT_OR_FAIL(s.buckets_rebuilt, "buckets were not rebuilt after the first iteration");
  if (reversed && steps >= 2 && s.num_buckets > 1)
    EXPECT_OR_FAIL(model.reducer().bucket_indices() != initial_buckets,
                   "the rebuild kept the guessed buckets although gradients arrived in another order");
  return 0;
}

int scenario_batchnorm(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = raw.rank(), world = raw.size();
  torch::manual_seed(3 + rank);
  Net net(false, true);
  ddp::DistributedDataParallel model(net, pg);
  expect_same_across_ranks(raw, net->buffers(), "initial buffers");
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    opt.zero_grad();
    torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters");
  }
  // Buffers differ after each local forward; before the next one every rank
  // takes rank 0's, so the same input now gives the same buffers everywhere.
  auto [x, y] = global_batch(99, 6);
  model(x);
  expect_same_across_ranks(raw, net->buffers(), "BatchNorm buffers");
  return 0;
}

int scenario_unused(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const std::string mode = flags["--mode"];
  torch::manual_seed(5);
  Net net(false, false, 4, true);
  Net ref(false, false, 4, true);
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().find_unused_parameters(mode != "error"));
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    const bool use_extra = mode == "rank0" && rank == 0;
    opt.zero_grad();
    auto loss = torch::mse_loss(model(x.narrow(0, 6 * rank, 6), use_extra), y.narrow(0, 6 * rank, 6));
    if (mode == "error") {
      try {
        loss.backward();
      } catch (const std::exception& e) {
        std::string what = e.what();
        std::cout << "caught: " << what << std::endl;
        EXPECT_OR_FAIL(what.find("extra.weight") != std::string::npos, "the error names the parameter");
        EXPECT_OR_FAIL(what.find("find_unused_parameters") != std::string::npos, "the error says what to do");
        return 0;
      }
      throw Fail("backward with an unused parameter did not fail");
    }
    loss.backward();
    if (mode == "none") {
      copy_params(*net, *ref);
      ref->zero_grad();
      torch::mse_loss(ref->forward(x), y).backward();
      expect_grads_close(*net, *ref, "unused step " + std::to_string(step));
      EXPECT_OR_FAIL(!net->extra->weight.grad().defined(), "a parameter no rank used keeps an undefined gradient");
    } else {
      EXPECT_OR_FAIL(net->extra->weight.grad().defined(), "a parameter rank 0 used has a gradient everywhere");
      expect_same_across_ranks(raw, {net->extra->weight.grad(), net->l1->weight.grad()}, "gradients");
    }
    opt.step();
    expect_same_across_ranks(raw, net->parameters(), "parameters");
  }
  return 0;
}

// Gradients accumulated under no_sync, then one synchronised backward; with
// --unused-branch 1 (and find_unused_parameters) the extra layer is used in
// the no_sync micro-steps only, and must still get the average of what every
// rank accumulated.
int scenario_no_sync(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg_ptr,
                     std::map<std::string, std::string> flags) {
  const int rank = raw.rank(), world = raw.size();
  const bool branch = flags["--unused-branch"] == "1";
  auto counting = std::make_shared<ddp::testing::CountingProcessGroup>(pg_ptr);
  torch::manual_seed(7);
  Net net(false, false, 4, branch);
  Net ref(false, false, 4, branch);
  ddp::DistributedDataParallel model(net, counting, ddp::DDPOptions().find_unused_parameters(branch));
  copy_params(*net, *ref);
  net->zero_grad();
  ref->zero_grad();
  for (int micro = 0; micro < 4; ++micro) {
    auto [x, y] = global_batch(micro, 6 * world);
    const bool use_extra = branch && micro < 3;
    torch::mse_loss(ref->forward(x, use_extra), y).backward();
    auto local = [&] {
      return torch::mse_loss(model(x.narrow(0, 6 * rank, 6), use_extra), y.narrow(0, 6 * rank, 6));
    };
    const int64_t before = counting->allreduces;
    if (micro < 3) {
      auto guard = model.no_sync();
      local().backward();
      EXPECT_OR_FAIL(counting->allreduces == before, "no communication inside no_sync");
    } else {
      local().backward();
      EXPECT_OR_FAIL(counting->allreduces > before, "the synchronised backward communicates");
    }
  }
  expect_grads_close(*net, *ref, "after 3 no_sync micro-batches and 1 synchronised", branch);
  return 0;
}

// Rank 1 builds a different model (--kind shape, the default), freezes a
// layer (frozen) or lays a weight out differently (strides): every rank
// fails with an error naming the difference.
int scenario_mismatch(ddp::ProcessGroup& raw, std::shared_ptr<ddp::ProcessGroup> pg,
                      std::map<std::string, std::string> flags) {
  const std::string kind = flags.count("--kind") ? flags["--kind"] : "shape";
  const bool odd = raw.rank() == 1;
  Net net(false, false, odd && kind == "shape" ? 5 : 4);
  std::string expected_name = "l3.weight";
  if (odd && kind == "frozen") {
    net->l1->weight.set_requires_grad(false);
    net->l1->bias.set_requires_grad(false);
    expected_name = "l1.weight";
  }
  if (odd && kind == "strides") {
    torch::NoGradGuard g;
    net->l2->weight.set_data(net->l2->weight.t().contiguous().t());
    expected_name = "l2.weight";
  }
  try {
    ddp::DistributedDataParallel model(net, pg);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find("not the same on every rank") != std::string::npos, "names the problem");
    EXPECT_OR_FAIL(what.find("rank " + std::to_string(raw.rank())) == 0, "names this rank");
    if (odd) EXPECT_OR_FAIL(what.find(expected_name) != std::string::npos, "names the parameter");
    return 0;
  }
  throw Fail("different models on different ranks were accepted");
}

// Options with tiny buckets: the first holds one small tensor, a 16x16
// double weight (2 KiB) is alone in its bucket.
ddp::DDPOptions tiny_buckets() { return ddp::DDPOptions().first_bucket_mb(0.0001).bucket_cap_mb(0.001); }

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
  std::set<const void*> seen;
  for (auto& p : net->parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
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
    for (const auto& b : model.reducer().bucket_indices()) alone = alone || b == std::vector<size_t>{shared_index};
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
  auto counting = std::make_shared<ddp::testing::CountingProcessGroup>(pg_ptr);
  torch::manual_seed(29);
  Net net(false, true);
  // No bucket rebuild (it broadcasts too): only buffer broadcasts are counted.
  ddp::DistributedDataParallel model(net, counting, ddp::DDPOptions().find_unused_parameters(true));
  // sync, no_sync, no_sync, sync, sync, no_sync, sync
  const std::vector<bool> syncs = {true, false, false, true, true, false, true};
  const std::vector<int64_t> expected = {1, 1, 0, 0, 1, 1, 0};
  for (size_t k = 0; k < syncs.size(); ++k) {
    auto [x, y] = global_batch(static_cast<int>(k), 6 * world);
    const int64_t before = counting->broadcasts;
    auto run = [&] { torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward(); };
    if (syncs[k]) {
      run();
    } else {
      auto guard = model.no_sync();
      run();
    }
    EXPECT_OR_FAIL(counting->broadcasts - before == expected[k],
                   "forward " + std::to_string(k) + ": " + std::to_string(counting->broadcasts - before) +
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
    return 0;
  }
  throw Fail("a model with a sparse embedding was accepted");
}

// Each tensor once, in the order DistributedDataParallel (and Python's
// named_parameters()) lists them.
std::vector<std::pair<std::string, torch::Tensor>> unique_parameters(const torch::nn::Module& m) {
  std::set<const void*> seen;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : m.named_parameters(true))
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  return out;
}

// The models, data and optimizer of pytorch_ddp_parity.py, case by case:
// change both together.
struct ParityCase {
  std::string variant;
  bool as_view;
  bool small_buckets;
};
const std::map<std::string, ParityCase>& parity_cases() {
  static const std::map<std::string, ParityCase> cases = {
      {"defaults", {"plain", false, false}},      {"bucket_view", {"plain", true, false}},
      {"buckets", {"plain", false, true}},        {"buckets_view", {"plain", true, true}},
      {"find_unused", {"extra", false, true}},    {"no_sync", {"plain", true, true}},
      {"batchnorm", {"batchnorm", false, true}},  {"tied", {"tied", true, true}},
      {"set_to_none", {"plain", true, true}},
  };
  return cases;
}

struct ParityNetImpl : torch::nn::Module {
  explicit ParityNetImpl(const std::string& variant) : variant(variant) {
    l1 = register_module("l1", torch::nn::Linear(6, 16));
    if (variant == "batchnorm") bn = register_module("bn", torch::nn::BatchNorm1d(16));
    l2 = register_module("l2", torch::nn::Linear(16, 16));
    if (variant == "tied") register_module("l2b", l2);  // the same layer twice: one parameter for DDP
    l3 = register_module("l3", torch::nn::Linear(16, 3));
    if (variant == "extra") extra = register_module("extra", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(torch::Tensor x, bool use_extra = false) {
    auto h = l1(x);
    if (bn) h = bn(h);
    h = torch::tanh(l2(torch::tanh(h)));
    if (variant == "tied") h = torch::tanh(l2(h));
    auto y = l3(h);
    if (use_extra) y = y + extra(x);
    return y;
  }
  std::string variant;
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, extra{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(ParityNet);

std::pair<torch::Tensor, torch::Tensor> parity_batch(int step, int rows) {
  auto n = torch::arange(rows, torch::kDouble).unsqueeze(1);
  auto x = torch::sin(0.1 * (step * 1000 + n * 7 + torch::arange(6, torch::kDouble).unsqueeze(0) * 3)).to(torch::kFloat);
  auto y = torch::cos(0.05 * (step * 500 + n * 5 + torch::arange(3, torch::kDouble).unsqueeze(0))).to(torch::kFloat);
  return {x, y};
}

std::string run_parity_case(const std::string& name, std::shared_ptr<ddp::ProcessGroup> pg) {
  const auto& c = parity_cases().at(name);
  const int rank = pg->rank(), world = pg->size();
  ParityNet net(c.variant);
  {
    torch::NoGradGuard g;
    int layer = 0;
    for (auto& [key, p] : unique_parameters(*net)) {
      auto k = torch::arange(p.numel(), torch::kDouble);
      auto v = key.find("weight") != std::string::npos ? 0.3 * torch::sin(0.7 * k + layer) : 0.01 * torch::cos(k + layer);
      p.copy_(v.reshape(p.sizes()).to(torch::kFloat));
      ++layer;
    }
  }
  auto options = ddp::DDPOptions().gradient_as_bucket_view(c.as_view).find_unused_parameters(name == "find_unused");
  if (c.small_buckets) options.first_bucket_mb(512.0 / (1 << 20)).bucket_cap_mb(1024.0 / (1 << 20));
  ddp::DistributedDataParallel model(net, pg, options);
  // LibTorch's parameters() lists a tied weight twice, and SGD would step it twice.
  std::vector<torch::Tensor> unique;
  for (auto& [key, p] : unique_parameters(*net)) unique.push_back(p);
  torch::optim::SGD opt(unique, torch::optim::SGDOptions(0.05).momentum(0.9));
  const int per_rank = 16, lo = rank * per_rank;
  for (int step = 0; step < 30; ++step) {
    if (name == "set_to_none") {
      for (auto& p : unique) p.mutable_grad() = torch::Tensor();  // LibTorch 2.x's zero_grad()
    } else {
      opt.zero_grad();
    }
    if (name == "no_sync") {
      for (int micro = 0; micro < 3; ++micro) {
        auto [x, y] = parity_batch(step * 3 + micro, per_rank * world);
        if (micro < 2) {
          auto guard = model.no_sync();
          torch::mse_loss(model(x.narrow(0, lo, per_rank)), y.narrow(0, lo, per_rank)).backward();
        } else {
          torch::mse_loss(model(x.narrow(0, lo, per_rank)), y.narrow(0, lo, per_rank)).backward();
        }
      }
    } else {
      auto [x, y] = parity_batch(step, per_rank * world);
      const bool use_extra = name == "find_unused" && (step % 3 == 0 || (rank == 0 && step % 2 == 0));
      torch::mse_loss(model(x.narrow(0, lo, per_rank), use_extra), y.narrow(0, lo, per_rank)).backward();
    }
    opt.step();
  }
  std::string bytes;
  auto append = [&](const torch::Tensor& t) {
    auto c = t.detach().to(torch::kFloat).contiguous();
    bytes.append(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  };
  for (auto& [key, p] : unique_parameters(*net)) append(p);
  for (auto& b : net->buffers(true))
    if (b.is_floating_point()) append(b);
  return bytes;
}

// Writes <out>/cpp_<case>_rank<r>.bin for every case in --cases (all by default).
int scenario_parity(std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  std::vector<std::string> cases;
  if (flags.count("--cases")) {
    std::stringstream list(flags["--cases"]);
    for (std::string c; std::getline(list, c, ',');) cases.push_back(c);
  } else {
    for (const auto& [name, c] : parity_cases()) cases.push_back(name);
  }
  for (const auto& name : cases) {
    const auto bytes = run_parity_case(name, pg);
    std::ofstream out(flags["--out"] + "/cpp_" + name + "_rank" + std::to_string(pg->rank()) + ".bin", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  return 0;
}

// DDPOptions::malloc_mmap_threshold_mb's automatic choice: at the largest
// gradient's size for a model with a 16 MiB weight, nothing for a small one.
// fix_malloc_thresholds() latches its first applied call, so asking for 1 MiB
// afterwards tells what DistributedDataParallel did.
int scenario_malloc(std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  const bool large = flags["--model"] == "large";
  torch::nn::Linear net(large ? 2048 : 32, large ? 2048 : 4);
  if (flags.count("--expect-error")) {
    try {
      ddp::DistributedDataParallel model(net, pg);
    } catch (const std::exception& e) {
      std::cout << "caught: " << e.what() << std::endl;
      EXPECT_OR_FAIL(std::string(e.what()).find(flags["--expect-error"]) != std::string::npos, e.what());
      return 0;
    }
    throw Fail("no error for DDP_MALLOC_MMAP_THRESHOLD_MB=" + std::string(std::getenv("DDP_MALLOC_MMAP_THRESHOLD_MB")));
  }
  ddp::DistributedDataParallel model(net, pg);
  const auto seen = ddp::fix_malloc_thresholds(1.0);
  std::cout << "malloc: " << seen.reason << std::endl;
  EXPECT_OR_FAIL(seen.applied, seen.reason);
  const bool env_off = std::getenv("DDP_MALLOC_MMAP_THRESHOLD_MB") != nullptr;
  const std::size_t expected = large && !env_off ? 2048u * 2048u * 4u : 1024u * 1024u;
  EXPECT_OR_FAIL(seen.mmap_threshold == expected, "threshold " + std::to_string(seen.mmap_threshold) + ", expected " +
                                                      std::to_string(expected));
  EXPECT_OR_FAIL(seen.trim_threshold == 2 * expected, "trim threshold twice the mmap threshold");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ddp_worker SCENARIO [--flag value ...]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  auto flags = parse_flags(argc, argv);
  try {
    const auto timeout = std::chrono::seconds(flags.count("--timeout") ? std::stoi(flags["--timeout"]) : 120);
    auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo").timeout(timeout));
    int rc = 1;
    if (scenario == "grads") rc = scenario_grads(*pg, pg, flags);
    else if (scenario == "batchnorm") rc = scenario_batchnorm(*pg, pg);
    else if (scenario == "unused") rc = scenario_unused(*pg, pg, flags);
    else if (scenario == "no_sync") rc = scenario_no_sync(*pg, pg, flags);
    else if (scenario == "mismatch") rc = scenario_mismatch(*pg, pg, flags);
    else if (scenario == "tied") rc = scenario_tied(*pg, pg, flags);
    else if (scenario == "undefined_grad") rc = scenario_undefined_grad(*pg, pg);
    else if (scenario == "reentrant") rc = scenario_reentrant(*pg, pg);
    else if (scenario == "failed_backward") rc = scenario_failed_backward(*pg, pg);
    else if (scenario == "buffers_once") rc = scenario_buffers_once(*pg, pg);
    else if (scenario == "channels_last") rc = scenario_channels_last(*pg, pg);
    else if (scenario == "sparse") rc = scenario_sparse(pg);
    else if (scenario == "parity") rc = scenario_parity(pg, flags);
    else if (scenario == "malloc") rc = scenario_malloc(pg, flags);
    else throw Fail("unknown scenario " + scenario);
    ddp::destroy_process_group();
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "FAILED: " << e.what() << std::endl;
    return 1;
  }
}
