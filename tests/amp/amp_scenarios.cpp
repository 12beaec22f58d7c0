// The mixed-precision scenarios of ddp_worker: the models, data and inf/NaN
// patterns of pytorch_amp_parity.py, case by case, trained by libddp with
// ddp::Autocast and ddp::GradScaler. Change both together.
#include <iomanip>
#include <limits>

#include "../support/worker_common.h"

namespace ddp::testing {

namespace {

struct AmpCase {
  bool batchnorm = false;
  bool autocast = false;
  bool scaler = false;
  std::set<int> inf_loss;  // steps whose loss is multiplied by inf, on the last rank
  std::set<int> bad_grad;  // steps with an inf (NaN at odd steps) put into one gradient after backward
};

const std::map<std::string, AmpCase>& amp_cases() {
  static const std::map<std::string, AmpCase> cases = {
      {"plain", {false, false, false, {}, {}}},
      {"autocast", {false, true, false, {}, {}}},
      {"autocast_batchnorm", {true, true, false, {}, {}}},
      {"scaler_loss", {false, false, true, {2, 7, 8, 15, 16, 17}, {}}},
      {"scaler_grad", {false, true, true, {}, {4, 5, 12, 20}}},
  };
  return cases;
}

struct AmpNetImpl : torch::nn::Module {
  explicit AmpNetImpl(bool batchnorm) {
    l1 = register_module("l1", torch::nn::Linear(6, 16));
    if (batchnorm) bn = register_module("bn", torch::nn::BatchNorm1d(16));
    l2 = register_module("l2", torch::nn::Linear(16, 16));
    l3 = register_module("l3", torch::nn::Linear(16, 3));
  }
  // torch::linear (Python's F.linear), not torch::nn::Linear's forward: that
  // runs addmm(bias, x, weight.t()), which under autocast casts the bias
  // before the weight, so the gradients become ready in another order than
  // in PyTorch, DDP rebuilds other buckets, and at 3 ranks Gloo sums some
  // values in another order (last-bit differences; docs/syncbn_zero_amp.md).
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::linear(x, l1->weight, l1->bias);
    if (bn) h = bn(h);
    h = torch::tanh(torch::linear(torch::tanh(h), l2->weight, l2->bias));
    return torch::linear(h, l3->weight, l3->bias);
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(AmpNet);

// One case: the final parameters and float buffers, and a line per step
// ("<step> <scale> <growth tracker> <stepped>") when it has a scaler.
std::pair<std::string, std::string> run_amp_case(const AmpCase& c, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  AmpNet net(c.batchnorm);
  init_parity_parameters(*net);
  // PyTorch's defaults (our gradient_as_bucket_view defaults to true), several buckets.
  auto options = ddp::DDPOptions().gradient_as_bucket_view(false);
  python_small_buckets(options, 512, 1024);
  ddp::DistributedDataParallel model(net, pg, options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  // scaler_grad's scaler takes the default group (no group given), the others this one.
  const auto scaler_options = ddp::GradScalerOptions().growth_interval(3).enabled(c.scaler);
  ddp::GradScaler scaler = c.bad_grad.empty() ? ddp::GradScaler(pg, scaler_options) : ddp::GradScaler(scaler_options);
  const int per_rank = 16, lo = rank * per_rank;
  std::ostringstream log;
  log << std::setprecision(17);
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    auto [x, y] = parity_batch(step, per_rank * world);
    torch::Tensor loss;
    {
      ddp::Autocast autocast(torch::kCPU, torch::kBFloat16, c.autocast);
      auto out = model(x.narrow(0, lo, per_rank));
      EXPECT_OR_FAIL(out.scalar_type() == (c.autocast ? torch::kBFloat16 : torch::kFloat),
                     "autocast did not run the linear layers in bfloat16");
      loss = torch::mse_loss(out, y.narrow(0, lo, per_rank));
    }
    if (c.inf_loss.count(step) && rank == world - 1) loss = loss * std::numeric_limits<float>::infinity();
    scaler.scale(loss).backward();
    for (auto& p : net->parameters())
      EXPECT_OR_FAIL(p.grad().scalar_type() == torch::kFloat, "a gradient is not float32 under autocast");
    if (c.bad_grad.count(step) && rank == world - 1) {
      // After DDP's all-reduce: only this rank sees it, and only the scaler's
      // own all-reduce makes the others skip the step too.
      torch::NoGradGuard no_grad;
      net->l2->weight.mutable_grad()[0][0] =
          step % 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    }
    const bool stepped = scaler.step(opt);
    scaler.update();
    if (c.scaler) log << step << " " << scaler.get_scale() << " " << scaler.get_growth_tracker() << " " << stepped << "\n";
  }
  expect_same_across_ranks(*pg, net->parameters(), "parameters after 30 steps");
  return {parity_state_bytes(*net), log.str()};
}

}  // namespace

// Writes <out>/cpp_<case>_rank<r>.bin (and _scales.txt with a scaler) for
// every case in --cases (all by default).
int scenario_amp_parity(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  std::vector<std::string> cases;
  if (flags.count("--cases")) {
    cases = split_commas(flags["--cases"]);
  } else {
    for (const auto& [name, c] : amp_cases()) cases.push_back(name);
  }
  for (const auto& name : cases) {
    const auto [bytes, scales] = run_amp_case(amp_cases().at(name), pg);
    const std::string base = flags["--out"] + "/cpp_" + name + "_rank" + std::to_string(pg->rank());
    write_bytes(base + ".bin", bytes);
    if (!scales.empty()) write_bytes(base + "_scales.txt", scales);
  }
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kAmpScenarios{
    {"amp_parity", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_amp_parity(pg, flags); }}};

}  // namespace ddp::testing
