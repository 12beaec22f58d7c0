// The smallest complete program on an installed libddp's core (ddp::ddp):
// README.md's example, which install_and_consume.sh keeps equal to this file.
// Start it with ddprun (or torchrun, srun, mpirun); alone, it is rank 0 of 1.
#include <ddp/ddp.h>

int main() {
  auto pg = ddp::init_process_group();                 // rank, world size, master: from the environment
  torch::nn::Sequential net(torch::nn::Linear(10, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  ddp::DistributedDataParallel model(net, pg, ddp::DistributedDataParallelOptions().bucket_cap_mb(25));
  torch::optim::SGD opt(net->parameters(), 0.1);
  auto x = torch::randn({64, 10}), y = torch::randn({64, 1});   // each rank: its own shard of the data
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    torch::mse_loss(model(x), y).backward();          // gradients averaged across ranks on return
    opt.step();
  }
}
