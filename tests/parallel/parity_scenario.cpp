// The parity scenario of ddp_worker: the models, data and optimizer of
// pytorch_ddp_parity.py, case by case, trained by libddp.
#include <algorithm>

#include <torch/version.h>

#include "../support/worker_common.h"

namespace ddp::testing {

// The models, data and optimizer of pytorch_ddp_parity.py, case by case:
// change both together.
struct ParityCase {
  std::string variant;
  bool as_view;
  bool small_buckets;
  std::string hook;  // a communication hook of ddp::hooks, or none
  bool static_graph = false;
};
const std::map<std::string, ParityCase>& parity_cases() {
  static const std::map<std::string, ParityCase> cases = {
      {"defaults", {"plain", false, false, ""}},      {"bucket_view", {"plain", true, false, ""}},
      {"buckets", {"plain", false, true, ""}},        {"buckets_view", {"plain", true, true, ""}},
      {"find_unused", {"extra", false, true, ""}},    {"no_sync", {"plain", true, true, ""}},
      {"batchnorm", {"batchnorm", false, true, ""}},  {"tied", {"tied", true, true, ""}},
      {"set_to_none", {"plain", true, true, ""}},
      // Communication hooks (pytorch_parity_test.cpp's kHookCases).
      {"hook_allreduce", {"plain", false, true, "allreduce"}},
      {"hook_allreduce_view", {"plain", true, true, "allreduce"}},
      {"hook_fp16", {"plain", false, true, "fp16"}},
      {"hook_fp16_view", {"plain", true, true, "fp16"}},
      {"hook_fp16_wrapper", {"plain", true, false, "fp16_wrapper"}},
      {"hook_fp16_no_sync", {"plain", true, true, "fp16"}},
      // static_graph (pytorch_parity_test.cpp's kStaticCases).
      {"static", {"plain", false, true, "", true}},
      {"static_view", {"plain", true, true, "", true}},
      {"static_rank_unused", {"extra", true, true, "", true}},
      {"static_never_used", {"extra", false, true, "", true}},
      {"static_tied", {"tied", true, true, "", true}},
      {"static_checkpoint", {"checkpoint", false, true, "", true}},
      {"static_checkpoint_view", {"checkpoint", true, true, "", true}},
      {"static_hook_allreduce", {"plain", false, true, "allreduce", true}},
  };
  return cases;
}

// torch.utils.checkpoint.checkpoint(layer, x) of PyTorch 1.13 (reentrant):
// the forward runs without a graph, the backward runs it again with one and
// a backward of its own through it, so the layer's parameters get their
// gradients from a nested backward pass.
struct ParityCheckpoint : torch::autograd::Function<ParityCheckpoint> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t layer) {
    ctx->save_for_backward({x});
    ctx->saved_data["layer"] = layer;
    torch::NoGradGuard no_grad;
    return (*reinterpret_cast<torch::nn::Linear*>(layer))(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto saved = ctx->get_saved_variables()[0];
    auto x = saved.detach().requires_grad_(saved.requires_grad());
    auto& layer = *reinterpret_cast<torch::nn::Linear*>(ctx->saved_data["layer"].toInt());
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = layer(x);
    }
    torch::autograd::backward({out}, {grad[0]});
    return {x.grad(), torch::Tensor()};
  }
};

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
    if (variant == "checkpoint") {
      const auto layer = reinterpret_cast<int64_t>(&l2);
      h = torch::tanh(ParityCheckpoint::apply(torch::tanh(h), layer));
      h = torch::tanh(ParityCheckpoint::apply(h, layer));
    } else {
      h = torch::tanh(l2(torch::tanh(h)));
    }
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
  init_parity_parameters(*net);
  auto options = ddp::DDPOptions()
                     .gradient_as_bucket_view(c.as_view)
                     .find_unused_parameters(name == "find_unused" || name == "static_never_used")
                     .static_graph(c.static_graph);
  if (c.small_buckets) python_small_buckets(options, 512, 1024);
  ddp::DistributedDataParallel model(net, pg, options);
  if (c.hook == "allreduce") model.register_comm_hook(pg, ddp::hooks::allreduce_hook);
  if (c.hook == "fp16") model.register_comm_hook(pg, ddp::hooks::fp16_compress_hook);
  if (c.hook == "fp16_wrapper")
    model.register_comm_hook(pg, ddp::hooks::fp16_compress_wrapper(ddp::hooks::allreduce_hook));
  // LibTorch's parameters() lists a tied weight twice, and SGD would step it twice.
  std::vector<torch::Tensor> unique;
  for (auto& [key, p] : unique_parameters(*net)) unique.push_back(p);
  torch::optim::SGD opt(unique, torch::optim::SGDOptions(0.05).momentum(0.9));
  const int per_rank = 16, lo = rank * per_rank;
  for (int step = 0; step < 30; ++step) {
    if (name == "set_to_none") {
      for (auto& p : unique) p.mutable_grad() = torch::Tensor();  // LibTorch 2.x's zero_grad()
    } else {
      // Zeros, as the script's zero_grad(set_to_none=False): LibTorch 2.x's
      // zero_grad() sets none by default (1.13's zeroes).
#if TORCH_VERSION_MAJOR >= 2
      opt.zero_grad(false);
#else
      opt.zero_grad();
#endif
    }
    if (name == "no_sync" || name == "hook_fp16_no_sync") {
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
      const bool use_extra = (name == "find_unused" && (step % 3 == 0 || (rank == 0 && step % 2 == 0))) ||
                             (name == "static_rank_unused" && rank == 0);
      torch::mse_loss(model(x.narrow(0, lo, per_rank), use_extra), y.narrow(0, lo, per_rank)).backward();
    }
    opt.step();
  }
  return parity_state_bytes(*net);
}

// Writes <out>/cpp_<case>_rank<r>.bin for every case in --cases (all by default).
int scenario_parity(std::shared_ptr<ddp::ProcessGroup> pg, std::map<std::string, std::string> flags) {
  std::vector<std::string> cases;
  if (flags.count("--cases")) {
    cases = split_commas(flags["--cases"]);
  } else {
    for (const auto& [name, c] : parity_cases()) cases.push_back(name);
  }
  if (flags.count("--cases") == 0) {
    // The hook and static_graph cases run in their own tests (at 2 and 3
    // ranks, and never over mpi, which has no float16 sum).
    cases.erase(std::remove_if(cases.begin(), cases.end(),
                               [](const std::string& c) { return c.rfind("hook_", 0) == 0 || c.rfind("static", 0) == 0; }),
                cases.end());
  }
  for (const auto& name : cases)
    write_bytes(flags["--out"] + "/cpp_" + name + "_rank" + std::to_string(pg->rank()) + ".bin",
                run_parity_case(name, pg));
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kParityScenario{
    {"parity", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_parity(pg, flags); }}};

}  // namespace ddp::testing
