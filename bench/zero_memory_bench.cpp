// What ZeRO-1 saves: optimizer-state memory per rank with Adam on a ~100 MB
// model (24.3M float parameters in ten Linear layers of different sizes),
// unsharded (torch::optim::Adam, what every rank of plain DDP holds) against
// ddp::ZeroRedundancyOptimizer. One rank of a job started by ddprun:
//   ddprun --standalone --nproc-per-node W ddp_bench_zero_memory [--optimizer zero|plain] [--steps 3]
// prints one line per rank: the state's bytes (every state tensor's nbytes),
// the current RSS grown from before the first step to after the last, and
// the peak RSS grown over the same steps. bench/run_zero_memory_bench.py
// runs W = 1 (plain) and W = 1..4 (zero) and writes bench/results/zero_memory.*.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "ddp/ddp.h"
#include "rss.h"

namespace {

struct BigNetImpl : torch::nn::Module {
  BigNetImpl() {
    // The largest weight is 1/6 of the model: the partition (whole tensors)
    // can come within ~10% of 1/W up to W = 4.
    const int sizes[] = {1536, 2048, 2048, 2048, 2048, 1536, 1536, 1024, 1024, 512, 10};
    constexpr int n = sizeof(sizes) / sizeof(sizes[0]);
    for (int i = 0; i + 1 < n; ++i)
      layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(sizes[i], sizes[i + 1])));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) x = i + 1 < layers.size() ? torch::relu(layers[i](x)) : layers[i](x);
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(BigNet);

using bench::current_rss_kb;
using bench::peak_rss_kb;

// The bytes of Adam's state tensors (exp_avg, exp_avg_sq, max_exp_avg_sq).
int64_t adam_state_bytes(const torch::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (const auto& [key, state] : opt.state()) {
    const auto& s = dynamic_cast<const torch::optim::AdamParamState&>(*state);
    for (const auto& t : {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()})
      if (t.defined()) bytes += t.nbytes();
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string optimizer = "zero";
  int steps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--optimizer") optimizer = v;
    else if (k == "--steps") steps = std::stoi(v);
  }
  torch::set_num_threads(1);
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo"));
  torch::manual_seed(0);
  BigNet net;
  int64_t params = 0;
  for (const auto& p : net->parameters()) params += p.numel();
  ddp::DistributedDataParallel model(net, pg);
  std::unique_ptr<torch::optim::Optimizer> opt;
  ddp::ZeroRedundancyOptimizer* zero = nullptr;
  if (optimizer == "plain") {
    opt = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-4));
  } else {
    auto z = std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), torch::optim::AdamOptions(1e-4), pg);
    zero = z.get();
    opt = std::move(z);
  }
  auto x = torch::randn({16, 1536}), y = torch::randn({16, 10});
  // Gradients exist before the first step is measured: only the step's own memory counts.
  torch::mse_loss(model(x), y).backward();
  const long rss_before = current_rss_kb(), peak_before = peak_rss_kb();
  for (int s = 0; s < steps; ++s) {
    if (s > 0) {
      opt->zero_grad();
      torch::mse_loss(model(x), y).backward();
    }
    opt->step();
  }
  const long rss_after = current_rss_kb(), peak_after = peak_rss_kb();
  const auto& holder = zero ? zero->local_optimizer() : *opt;
  const int64_t owned = zero ? zero->partition().numel[pg->rank()] : params;
  std::cout << "ZERO_MEMORY optimizer=" << optimizer << " world=" << pg->size() << " rank=" << pg->rank()
            << " params=" << params << " owned_params=" << owned << " state_bytes=" << adam_state_bytes(holder)
            << " rss_delta_kb=" << (rss_after - rss_before) << " peak_rss_delta_kb=" << (peak_after - peak_before)
            << " rss_after_kb=" << rss_after << std::endl;
  pg->barrier();
  return 0;
}
