// Trains a few steps through ddp::DistributedDataParallel, built against the
// installed package's core only. Start it with ddprun (or torchrun, srun,
// mpirun); alone, it is rank 0 of 1.
#include <ddp/ddp.h>

#include <iostream>

int main() {
  return ddp::guarded_main([] {
    auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(60)));
    torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
    ddp::DistributedDataParallel model(net, pg, ddp::DistributedDataParallelOptions().bucket_cap_mb(25));
    torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      torch::mse_loss(model(torch::ones({2, 4})), torch::zeros({2, 1})).backward();
      opt.step();
    }
    std::cout << "consumer ok: rank " << pg->rank() << "/" << pg->size() << ", backend " << pg->backend_name()
              << ", buckets " << model.stats().num_buckets << std::endl;
    ddp::destroy_process_group();
    return 0;
  });
}
