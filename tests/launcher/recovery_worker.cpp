// A worker of in-process recovery's tests: trains a small model with
// DistributedDataParallel on a recoverable group (ddprun
// --recover-in-process), a global batch of 12 rows per step split among the
// ranks of the current generation, and writes what the test compares.
//   recovery_worker DIR STEPS [FAULT_RANK FAULT_STEP kill|stop|exit|node|twice|pair|commit]
// The worker of launch rank FAULT_RANK, at step FAULT_STEP, between its
// forward and its backward: SIGKILLs itself, SIGSTOPs itself, exits 3,
// SIGKILLs its ddprun and itself (the node is lost: its other workers end
// with their ddprun), or, for `twice`, SIGKILLs itself, and the worker of
// launch rank FAULT_RANK + 1 does at the same step's retry (a second fault
// right after the group re-formed); `pair`: it and the worker of launch
// rank FAULT_RANK + 1 SIGKILL themselves in the same step; `commit`:
// SIGKILLs itself once the step committed, before its optimizer steps.
// RECOVERY_WORKER_ZERO=1: Adam under a ZeroRedundancyOptimizer (each shard
// on two ranks) instead of SGD; the one-process reference uses Adam too.
// RECOVERY_WORKER_JOIN=1: uneven inputs under ddp::Join (gradients divided
// by the ranks still training): launch rank s trains STEPS - s steps, each
// on the whole batch, so the model the last to finish holds is the
// reference's.
// RECOVERY_WORKER_STEP_MS: a pause in every step while the group is smaller
// than at the start (time for a replacement to start). A replacement
// (ddprun --max-restarts) takes the step count and the parameters from the
// group when it is taken in (set_state).
// DIR/starts.<slot>: a line per start of that slot's process (one, but for
// a slot whose worker was replaced). DIR/result.<slot>: generation, size,
// members, the steps committed, the largest difference from the same steps
// trained in one process on the whole batch. DIR/params.<slot>: the parameters' bytes,
// for the bitwise comparison across ranks.
#include <ddp/comm/recovery.h>
#include <ddp/optim/zero_redundancy_optimizer.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/parallel/join.h>
#include <ddp/runtime/main_guard.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace {

constexpr int kRows = 12;  // the global batch: divides among 1, 2, 3, 4 or 6 ranks

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
  net->to(torch::kDouble);
  return net;
}

std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return {torch::randn({kRows, 8}, gen, torch::kDouble), torch::randn({kRows, 4}, gen, torch::kDouble)};
}

const torch::optim::AdamOptions kAdam(0.01);

// The same steps in one process, on the whole batch each time.
torch::nn::Sequential reference(int steps, bool adam) {
  auto net = make_net();
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (adam) opt = std::make_unique<torch::optim::Adam>(net->parameters(), kAdam);
  else opt = std::make_unique<torch::optim::SGD>(net->parameters(), 0.1);
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    opt->zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    opt->step();
  }
  return net;
}

void fault(const std::string& how) {
  if (how == "kill") ::kill(::getpid(), SIGKILL);
  if (how == "stop") ::kill(::getpid(), SIGSTOP);
  if (how == "exit") std::_Exit(3);
  if (how == "node") {
    ::kill(::getppid(), SIGKILL);
    ::kill(::getpid(), SIGKILL);
  }
}

int train(int argc, char** argv) {
  if (argc != 3 && argc != 6) {
    std::fprintf(stderr, "usage: recovery_worker DIR STEPS [FAULT_RANK FAULT_STEP kill|stop|exit|node|twice]\n");
    return 64;
  }
  const std::string dir = argv[1];
  const int steps = std::atoi(argv[2]);
  const int fault_rank = argc == 6 ? std::atoi(argv[3]) : -1;
  const int fault_step = argc == 6 ? std::atoi(argv[4]) : -1;
  const std::string how = argc == 6 ? argv[5] : "";

  ddp::RecoveryOptions options;
  options.deadline = std::chrono::seconds(3);
  auto group = ddp::init_recoverable_group(options);
  const int slot = group->slot();
  const int world = group->size();  // at the start
  std::ofstream(dir + "/starts." + std::to_string(slot), std::ios::app) << ::getpid() << "\n";

  auto net = make_net();
  ddp::DistributedDataParallel model(net, group);
  const char* zero = std::getenv("RECOVERY_WORKER_ZERO");
  const bool adam = zero && std::string(zero) == "1";
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (adam) opt = std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), kAdam, group);
  else opt = std::make_unique<torch::optim::SGD>(net->parameters(), 0.1);
  int step = 0;
  int attempts = 0;
  group->set_state(
      [&] {
        std::ostringstream out;
        auto params = net->parameters();
        params.push_back(torch::tensor(static_cast<int64_t>(step)));
        torch::save(params, out);
        return out.str();
      },
      [&](const std::string& bytes) {
        std::istringstream in(bytes);
        std::vector<torch::Tensor> got;
        torch::load(got, in);
        torch::NoGradGuard no_grad;
        auto params = net->parameters();
        for (size_t i = 0; i < params.size(); ++i) params[i].copy_(got.at(i));
        step = static_cast<int>(got.back().item<int64_t>());
      });
  const char* pause = std::getenv("RECOVERY_WORKER_STEP_MS");
  const char* uneven = std::getenv("RECOVERY_WORKER_JOIN");
  std::optional<ddp::Join> join;
  if (uneven && std::string(uneven) == "1")
    join.emplace(std::vector<ddp::Joinable*>{&model}, ddp::JoinOptions().divide_by_initial_world_size(false));
  const int my_steps = join ? steps - slot : steps;
  while (step < my_steps) {
    if (pause && !group->joining() && static_cast<int>(group->members().size()) < world)
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(pause)));
    ++attempts;
    const bool committed = group->run_step([&] {
      auto [x, y] = batch(step);
      const int64_t rows = join ? kRows : kRows / group->size();
      auto mine = x.narrow(0, join ? 0 : group->rank() * rows, rows);
      auto target = y.narrow(0, join ? 0 : group->rank() * rows, rows);
      opt->zero_grad();
      auto loss = torch::mse_loss(model(mine), target);
      if (step == fault_step && how == "twice" && slot == fault_rank + 1 && group->generation() == 1)
        fault("kill");
      if (step == fault_step && how == "pair" && slot == fault_rank + 1) fault("kill");
      if (step == fault_step && slot == fault_rank) fault(how == "twice" || how == "pair" ? "kill" : how);
      loss.backward();
    });
    if (committed) {
      if (step == fault_step && slot == fault_rank && how == "commit") fault("kill");
      opt->step();
      ++step;
    }
  }
  if (join) join->finish();  // shadows the ranks still training, then takes the last one's model

  auto ref = reference(steps, adam);
  double diff = 0;
  std::ofstream params(dir + "/params." + std::to_string(slot), std::ios::binary);
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    auto p = net->parameters()[i].contiguous();
    diff = std::max(diff, (p - ref->parameters()[i]).abs().max().item<double>());
    params.write(static_cast<const char*>(p.data_ptr()), static_cast<std::streamsize>(p.numel() * sizeof(double)));
  }
  std::string members;
  for (int m : group->members()) members += (members.empty() ? "" : ",") + std::to_string(m);
  std::ofstream(dir + "/result." + std::to_string(slot))
      << "generation " << group->generation() << "\nsize " << group->size() << "\nmembers " << members
      << "\ncommitted " << step << "\nattempts " << attempts << "\ndiff " << diff << "\n";
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::guarded_main([&] { return train(argc, argv); });
}
