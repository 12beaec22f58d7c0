// Trains one step through ddp::DistributedDataParallel, built against the
// installed package only.
#include <ddp/ddp.h>

#include <iostream>

int main() {
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().bucket_cap_mb(25));
  torch::mse_loss(model(torch::ones({2, 4})), torch::zeros({2, 1})).backward();
  std::cout << "consumer ok: rank " << pg->rank() << "/" << pg->size() << ", backend " << pg->backend_name()
            << ", buckets " << model.stats().num_buckets << std::endl;
  ddp::destroy_process_group();
  return 0;
}
