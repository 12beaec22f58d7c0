// PowerSGD in ddp_worker: the model, data and optimizer of
// pytorch_powersgd_parity.py trained by libddp's powerSGD_hook, case by case;
// what a hook's gradients() are; its UsageErrors; and the program's global
// generator left alone.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <fstream>
#include <iostream>

#include "../support/worker_common.h"

namespace ddp::testing {

namespace {

using ddp::hooks::PowerSGDOptions;

// The cases of pytorch_powersgd_parity.py: change both together.
struct PowerSGDCase {
  bool as_view;
  bool small_buckets;
  PowerSGDOptions options;
};
const std::map<std::string, PowerSGDCase>& powersgd_cases() {
  static const std::map<std::string, PowerSGDCase> cases = {
      {"rank1", {false, true, PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2)}},
      {"rank1_view", {true, true, PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2)}},
      {"rank2", {true, true, PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(3)}},
      {"rank4_qr",
       {false, true, PowerSGDOptions().matrix_approximation_rank(4).start_powerSGD_iter(2).min_compression_rate(1)}},
      {"rank3_qr_cold",
       {true, true,
        PowerSGDOptions().matrix_approximation_rank(3).start_powerSGD_iter(2).min_compression_rate(1).warm_start(
            false)}},
      {"rank1_cold",
       {false, true, PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2).warm_start(false)}},
      {"rank2_no_error_feedback",
       {true, true, PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(2).use_error_feedback(false)}},
      {"start0",
       {false, true,
        PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(0).use_error_feedback(false).warm_start(
            false)}},
      {"rate10",
       {true, true, PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(2).min_compression_rate(10)}},
      {"batched",
       {true, true,
        PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(2).batch_tensors_with_same_shape(true)}},
      {"batched_one_bucket",
       {false, false,
        PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2).batch_tensors_with_same_shape(true)}},
      {"epsilon_seed",
       {true, true,
        PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(2).orthogonalization_epsilon(1e-8).random_seed(
            2024)}},
      {"one_bucket", {false, false, PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2)}},
  };
  return cases;
}

// 2-D weights large enough to compress, two of the same shape, and a
// convolution whose 4-D weight PowerSGD sees as [8, 18].
struct PowerSGDNetImpl : torch::nn::Module {
  PowerSGDNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 8, 3).padding(1)));
    fc1 = register_module("fc1", torch::nn::Linear(128, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, 32));
    fc4 = register_module("fc4", torch::nn::Linear(32, 32));
    out = register_module("out", torch::nn::Linear(32, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::tanh(conv(x)).flatten(1);
    h = torch::tanh(fc1(h));
    h = torch::tanh(fc2(h));
    h = torch::tanh(fc3(h));
    h = torch::tanh(fc4(h));
    return out(h);
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, fc4{nullptr}, out{nullptr};
};
TORCH_MODULE(PowerSGDNet);

// Weights scaled by their fan-in (pytorch_powersgd_parity.py's fan_in_scale),
// so that 30 steps through five tanh layers neither saturate nor vanish.
void init_powersgd_net(PowerSGDNet& net) {
  init_parity_parameters(*net, [](const torch::Tensor& w) {
    return 0.9 / std::sqrt(static_cast<double>(w.numel() / w.size(0)));
  });
}

std::pair<torch::Tensor, torch::Tensor> powersgd_batch(int step, int rows) {
  auto n = torch::arange(rows, torch::kDouble).unsqueeze(1);
  auto x = torch::sin(0.1 * (step * 1000 + n * 7 + torch::arange(32, torch::kDouble).unsqueeze(0) * 3)).to(torch::kFloat);
  auto y = torch::cos(0.05 * (step * 500 + n * 5 + torch::arange(3, torch::kDouble).unsqueeze(0))).to(torch::kFloat);
  return {x.reshape({-1, 2, 4, 4}), y};
}

// The final parameters as raw float32, and "iter before after" of the state.
std::pair<std::string, std::string> run_powersgd_case(const std::string& name, std::shared_ptr<ProcessGroup> pg) {
  const auto& c = powersgd_cases().at(name);
  const int rank = pg->rank(), world = pg->size();
  PowerSGDNet net;
  init_powersgd_net(net);
  auto options = ddp::DDPOptions().gradient_as_bucket_view(c.as_view);
  if (c.small_buckets) python_small_buckets(options, 512, 8192);
  ddp::DistributedDataParallel model(net, pg, options);
  // The state lives in the model; a pointer to read its statistics at the end.
  const ddp::hooks::PowerSGDState* state = nullptr;
  model.register_comm_hook(ddp::hooks::PowerSGDState(nullptr, c.options),
                           [&state](ddp::hooks::PowerSGDState& s, ddp::GradBucket& bucket) {
                             state = &s;
                             return ddp::hooks::powerSGD_hook(s, bucket);
                           });
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  // The random Qs must come from a generator of the hook's own.
  const at::Tensor global_rng = at::detail::getDefaultCPUGenerator().get_state();
  const int per_rank = 16, lo = rank * per_rank;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    auto [x, y] = powersgd_batch(step, per_rank * world);
    torch::mse_loss(model(x.narrow(0, lo, per_rank)), y.narrow(0, lo, per_rank)).backward();
    opt.step();
  }
  EXPECT_OR_FAIL(torch::equal(global_rng, at::detail::getDefaultCPUGenerator().get_state()),
                 name + ": the hook drew from (or reseeded) the global generator");
  const std::string bytes = parity_state_bytes(*net);  // the parameters: the net has no buffers
  EXPECT_OR_FAIL(state != nullptr, "the hook ran");
  const auto stats = state->compression_stats();
  const std::string line = std::to_string(state->iter()) + " " + std::to_string(stats.numel_before_compression) + " " +
                           std::to_string(stats.numel_after_compression) + "\n";
  return {bytes, line};
}

}  // namespace

// Writes <out>/cpp_<case>_rank<r>.bin and .stats for every case in --cases
// (all by default).
int scenario_powersgd_parity(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  std::vector<std::string> cases;
  if (flags.count("--cases")) {
    cases = split_commas(flags["--cases"]);
  } else {
    for (const auto& [name, c] : powersgd_cases()) cases.push_back(name);
  }
  for (const auto& name : cases) {
    const auto [bytes, stats] = run_powersgd_case(name, pg);
    const std::string prefix = flags["--out"] + "/cpp_" + name + "_rank" + std::to_string(pg->rank());
    write_bytes(prefix + ".bin", bytes);
    std::ofstream(prefix + ".stats") << stats;
  }
  return 0;
}

// What powerSGD_hook relies on: GradBucket::gradients() are row-major views
// of buffer(), shaped as the parameters, in the bucket's order, so writes
// into them land in the bucket; and a hook that returns buffer() itself
// hands the reducer its own tensor back, which becomes the gradients.
int scenario_powersgd_gradients(std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  PowerSGDNet net;
  init_powersgd_net(net);
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().first_bucket_mb(0.0005).bucket_cap_mb(0.008));
  model.register_comm_hook(0, [](int&, ddp::GradBucket& bucket) {
    const at::Tensor& buffer = bucket.buffer();
    auto grads = bucket.gradients();
    int64_t offset = 0;
    for (size_t k = 0; k < grads.size(); ++k) {
      const auto& g = grads[k];
      EXPECT_OR_FAIL(g.sizes() == bucket.parameters()[k].sizes(), "shaped as the parameter");
      EXPECT_OR_FAIL(g.is_contiguous(), "row-major");
      EXPECT_OR_FAIL(g.data_ptr() == static_cast<char*>(buffer.data_ptr()) + offset * buffer.element_size(),
                     "a view of the buffer at the parameter's offset");
      offset += g.numel();
      // Each gradient becomes the index of its first element in the bucket,
      // through its 2-D view as PowerSGD takes it.
      auto matrix = g.view({g.size(0), -1});
      matrix.copy_(torch::arange(offset - g.numel(), offset, buffer.options()).view(matrix.sizes()));
    }
    EXPECT_OR_FAIL(offset == buffer.numel(), "the gradients tile the buffer");
    EXPECT_OR_FAIL(torch::equal(buffer, torch::arange(buffer.numel(), buffer.options())),
                   "the writes landed in the buffer, in order");
    return ddp::CommFuture::ready(buffer);
  });
  for (int step = 0; step < 2; ++step) {  // before and after the bucket rebuild
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    auto [x, y] = powersgd_batch(step, 4 * world);
    torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
  }
  EXPECT_OR_FAIL(model.stats().num_buckets >= 3, "several buckets");
  for (auto& [key, p] : unique_parameters(*net)) {
    const auto g = p.grad().flatten();
    EXPECT_OR_FAIL(torch::equal(g, torch::arange(g.numel(), g.options()) + g[0]),
                   key + "'s gradient is what the hook wrote into its view");
  }
  return 0;
}

// Misuse, on every rank alike and before any collective: a state that would
// remember tensors across the bucket rebuild (PyTorch's ValueError), and
// float16 gradients (here through fp16_compress_wrapper) on CPUs, where
// LibTorch has no float16 bmm. UsageErrors naming the rank and what to do;
// the dtype one from the first backward, leaving no rank in a collective.
int scenario_powersgd_usage(std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  const std::string rank_prefix = "rank " + std::to_string(rank) + ": ";
  try {
    ddp::hooks::PowerSGDState state(pg, PowerSGDOptions().start_powerSGD_iter(1));
    throw Fail("start_powerSGD_iter(1) with error feedback and warm start was accepted");
  } catch (const ddp::UsageError& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find(rank_prefix + "PowerSGDState: ") == 0, "names the rank");
    EXPECT_OR_FAIL(what.find("start_powerSGD_iter(2)") != std::string::npos, "says what to do");
  }

  PowerSGDNet net;
  init_powersgd_net(net);
  ddp::DistributedDataParallel model(net, pg);
  model.register_comm_hook(ddp::hooks::PowerSGDState(pg, PowerSGDOptions().start_powerSGD_iter(2)),
                           ddp::hooks::fp16_compress_wrapper(ddp::hooks::powerSGD_hook));
  auto [x, y] = powersgd_batch(0, 4 * world);
  try {
    torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
  } catch (const ddp::UsageError& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find(rank_prefix + "powerSGD_hook: ") == 0, "names the rank");
    EXPECT_OR_FAIL(what.find("Half") != std::string::npos, "names the dtype");
    EXPECT_OR_FAIL(what.find("float32") != std::string::npos, "says what to use");
    pg->barrier();  // every rank got here: none is stuck in a collective
    return 0;
  }
  throw Fail("a float16 bucket on the CPU was not refused");
}

// The program's random numbers are its own: with a random Q drawn in every
// compressed iteration (no warm start), the global generator gives after
// training what it would have given without it.
int scenario_powersgd_global_rng(std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  PowerSGDNet net;
  init_powersgd_net(net);
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().first_bucket_mb(0.0005).bucket_cap_mb(0.008));
  model.register_comm_hook(
      ddp::hooks::PowerSGDState(pg, PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false)),
      ddp::hooks::powerSGD_hook);
  torch::manual_seed(7);
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = powersgd_batch(step, 4 * world);
    torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
  }
  const auto after_training = torch::randn({64});
  torch::manual_seed(7);
  EXPECT_OR_FAIL(torch::equal(after_training, torch::randn({64})), "PowerSGD drew from the global generator");
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kPowersgdScenarios{
    {"powersgd_parity", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_powersgd_parity(pg, flags); }},
    {"powersgd_gradients", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_powersgd_gradients(pg); }},
    {"powersgd_usage", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_powersgd_usage(pg); }},
    {"powersgd_global_rng", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_powersgd_global_rng(pg); }}};

}  // namespace ddp::testing
