// The timeline scenario of ddp_worker: a few steps with several buckets
// under DDP_TIMELINE; the test checks the trace rank 0 writes.
#include "../support/worker_common.h"

namespace ddp::testing {

int scenario_timeline(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank(), world = pg->size();
  const int steps = flags.count("--steps") ? std::stoi(flags["--steps"]) : 4;
  torch::manual_seed(37);
  Net net(false, false);
  {
    ddp::DistributedDataParallel model(net, pg, tiny_buckets());
    EXPECT_OR_FAIL(model.timeline() != nullptr, "DDP_TIMELINE starts a timeline");
    torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = global_batch(step, 6 * world);
      opt.zero_grad();
      torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6)).backward();
      opt.step();
    }
  }  // the trace is written here
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kTimelineScenario{
    {"timeline", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_timeline(pg, flags); }}};

}  // namespace ddp::testing
