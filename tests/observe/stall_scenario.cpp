// The stall scenario of ddp_worker: rank 1 stops itself (SIGSTOP) before
// its backward of step 2 for --stop-seconds; a child it forked wakes it
// (SIGCONT). The others wait for its buckets meanwhile; with
// DDP_STALL_CHECK_TIME_SECONDS below the stop, their stall inspector speaks.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/worker_common.h"

namespace ddp::testing {

int scenario_stall(std::shared_ptr<ddp::ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank(), world = pg->size();
  const int stop_seconds = flags.count("--stop-seconds") ? std::stoi(flags["--stop-seconds"]) : 4;
  torch::manual_seed(41);
  Net net(false, false);
  ddp::DistributedDataParallel model(net, pg, tiny_buckets());
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = global_batch(step, 6 * world);
    opt.zero_grad();
    auto loss = torch::mse_loss(model(x.narrow(0, 6 * rank, 6)), y.narrow(0, 6 * rank, 6));
    if (rank == 1 && step == 2) {
      const pid_t self = ::getpid();
      const pid_t waker = ::fork();
      if (waker == 0) {
        ::sleep(stop_seconds);
        ::kill(self, SIGCONT);
        ::_exit(0);
      }
      ::raise(SIGSTOP);
      ::waitpid(waker, nullptr, 0);
    }
    loss.backward();
    opt.step();
  }
  expect_same_across_ranks(*pg, net->parameters(), "parameters after the stall");
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kStallScenario{
    {"stall", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_stall(pg, flags); }}};

}  // namespace ddp::testing
