// The static_graph scenarios of ddp_worker: what it saves in collectives
// against find_unused_parameters, gradient accumulation (which PyTorch 1.13
// cannot run with static_graph) against one process, and the errors when the
// graph changes after the first iteration.
#include <iostream>

#include "../support/fake_process_group.h"
#include "../support/worker_common.h"

namespace ddp::testing {

namespace {

// The extra layer is never used: both ways find it unused. Returns the
// all-reduces of each of `steps` iterations, and checks the gradients
// against one process on the global batch every step.
std::vector<int64_t> allreduces_per_step(std::shared_ptr<ddp::ProcessGroup> pg, ddp::DDPOptions options, int steps,
                                         int64_t* broadcasts) {
  const int rank = pg->rank(), world = pg->size();
  auto counting = std::make_shared<CountingGroup>(pg);
  torch::manual_seed(23);
  Net net(false, false, 4, true), ref(false, false, 4, true);
  copy_params(*net, *ref);
  ddp::DistributedDataParallel model(net, counting, options);
  const int64_t broadcasts_at_start = counting->counts().broadcasts;
  std::vector<int64_t> counts;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    net->zero_grad();
    ref->zero_grad();
    const int64_t before = counting->counts().allreduces;
    torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
    counts.push_back(counting->counts().allreduces - before);
    torch::mse_loss(ref->forward(x), y).backward();
    expect_grads_close(*net, *ref, "step " + std::to_string(step));
    EXPECT_OR_FAIL(!net->extra->weight.grad().defined(), "the parameter no rank used keeps no gradient");
  }
  *broadcasts = counting->counts().broadcasts - broadcasts_at_start;
  return counts;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

// --mode collectives: static_graph all-reduces the usage map once, in the
// first iteration, where find_unused_parameters does every iteration.
int collectives(std::shared_ptr<ddp::ProcessGroup> pg) {
  const int steps = 6;
  int64_t dynamic_broadcasts = 0, static_broadcasts = 0;
  auto dynamic = allreduces_per_step(pg, tiny_buckets().find_unused_parameters(true), steps, &dynamic_broadcasts);
  auto fixed = allreduces_per_step(pg, tiny_buckets().static_graph(true), steps, &static_broadcasts);
  auto fixed_with_flag = allreduces_per_step(pg, tiny_buckets().static_graph(true).find_unused_parameters(true), steps,
                                             &static_broadcasts);
  std::cout << "all-reduces per step, find_unused_parameters: " << join(dynamic) << "; static_graph: " << join(fixed)
            << std::endl;
  EXPECT_OR_FAIL(fixed == fixed_with_flag, "static_graph ignores find_unused_parameters");
  // find_unused_parameters: the first iteration's buckets (as PyTorch, first
  // bucket then cap) and the usage map, every step.
  const int64_t buckets = dynamic[1] - 1;
  EXPECT_OR_FAIL(buckets >= 3, "tiny buckets give several buckets: " + join(dynamic));
  for (int s = 0; s < steps; ++s) EXPECT_OR_FAIL(dynamic[s] == buckets + 1, "find_unused_parameters: " + join(dynamic));
  // static_graph: one bucket and the usage map after the first backward; the
  // same bucket, overlapped, in the second; the rebuilt buckets from the third.
  EXPECT_OR_FAIL(fixed[0] == 2, "static_graph's first iteration: " + join(fixed));
  EXPECT_OR_FAIL(fixed[1] == 1, "static_graph's second iteration: " + join(fixed));
  for (int s = 2; s < steps; ++s) EXPECT_OR_FAIL(fixed[s] == buckets, "static_graph, later: " + join(fixed));
  EXPECT_OR_FAIL(static_broadcasts == 1, "one rebuild broadcast");
  return 0;
}

// --mode no_sync: three micro-batches accumulated, one synchronised, for
// three cycles; the gradients equal one process's on the global batches.
int no_sync(std::shared_ptr<ddp::ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  torch::manual_seed(29);
  Net net(false, false, 4, true), ref(false, false, 4, true);
  copy_params(*net, *ref);
  ddp::DistributedDataParallel model(net, pg, tiny_buckets().static_graph(true));
  for (int cycle = 0; cycle < 3; ++cycle) {
    net->zero_grad();
    ref->zero_grad();
    for (int micro = 0; micro < 4; ++micro) {
      // Not a structured binding: the lambda below captures it, which clang
      // before 16 refuses (C++20); the sanitized build uses clang.
      torch::Tensor x, y;
      std::tie(x, y) = global_batch(cycle * 4 + micro, 6 * world);
      torch::mse_loss(ref->forward(x), y).backward();
      auto local = [&] { return torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)); };
      if (micro < 3) {
        auto guard = model.no_sync();
        local().backward();
      } else {
        local().backward();
      }
    }
    expect_grads_close(*net, *ref, "cycle " + std::to_string(cycle));
  }
  return 0;
}

// --mode used_later / unused_later: the extra layer joins the graph (or
// leaves it) in the third iteration, on every rank: a UsageError naming it,
// from that backward (a gradient the first iteration did not have) or, as
// PyTorch, from the forward after it (a gradient missing).
int graph_changes(std::shared_ptr<ddp::ProcessGroup> pg, bool used_later) {
  const int rank = pg->rank(), world = pg->size();
  torch::manual_seed(31);
  Net net(false, false, 4, true);
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().static_graph(true));
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    net->zero_grad();
    const bool use_extra = used_later ? step == 2 : step < 2;
    if (step < 2) {
      torch::mse_loss(model(x.narrow(0, 6 * rank, 6), use_extra), y.narrow(0, 6 * rank, 6)).backward();
      continue;
    }
    try {
      torch::mse_loss(model(x.narrow(0, 6 * rank, 6), use_extra), y.narrow(0, 6 * rank, 6)).backward();
    } catch (const ddp::UsageError& e) {
      const std::string what = e.what();
      std::cout << "caught: " << what << std::endl;
      EXPECT_OR_FAIL(what.find("rank " + std::to_string(rank)) != std::string::npos, "the error names the rank");
      EXPECT_OR_FAIL(what.find("extra.") != std::string::npos, "the error names the parameter");
      EXPECT_OR_FAIL(what.find("static_graph") != std::string::npos, "the error says what to do");
      return 0;
    }
  }
  throw Fail("a graph that changed under static_graph did not fail");
}

}  // namespace

int scenario_static_graph(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  const std::string mode = flags["--mode"];
  if (mode == "collectives") return collectives(pg);
  if (mode == "no_sync") return no_sync(pg);
  if (mode == "used_later" || mode == "unused_later") return graph_changes(pg, mode == "used_later");
  throw Fail("static_graph: unknown --mode '" + mode + "'");
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kStaticGraphScenarios{
    {"static_graph", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_static_graph(pg, flags); }}};

}  // namespace ddp::testing
