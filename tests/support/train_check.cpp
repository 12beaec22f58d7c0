// A small end-to-end DDP run for launch tests (ddprun, network namespaces,
// mpirun, Slurm): reads its rank from the environment, joins a Gloo group
// (or --backend NAME's), trains an MLP for a few steps and exits 0 iff every
// rank ends with the same parameters. Prints one line per rank.
#include <iostream>

#include "ddp/ddp.h"

int main(int argc, char** argv) {
  try {
    // --backend NAME (gloo unless given): the MPI launch tests use mpi too.
    std::string backend = "gloo";
    for (int i = 1; i + 1 < argc; ++i)
      if (std::string(argv[i]) == "--backend") backend = argv[i + 1];
    auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend(backend).timeout(std::chrono::seconds(120)));
    torch::manual_seed(pg->rank());  // skewed on purpose: DDP must synchronise it
    torch::nn::Sequential net(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
    ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().bucket_cap_mb(0.01));
    torch::optim::SGD opt(net->parameters(), 0.1);
    torch::Tensor loss;
    for (int step = 0; step < 10; ++step) {
      torch::manual_seed(100 * step + pg->rank());
      auto x = torch::randn({32, 16});
      auto y = torch::randn({32, 4});
      opt.zero_grad();
      loss = torch::mse_loss(model(x), y);
      loss.backward();
      opt.step();
    }
    std::vector<torch::Tensor> flat;
    for (auto& p : net->parameters()) flat.push_back(p.detach().reshape(-1));
    auto all = pg->allgather(torch::cat(flat));
    for (int r = 1; r < pg->size(); ++r) {
      if (!torch::equal(all[r], all[0])) {
        std::cerr << "rank " << pg->rank() << ": parameters differ from rank " << r << std::endl;
        return 1;
      }
    }
    const auto env = ddp::LaunchEnv::from_environment();
    std::cout << "rank " << pg->rank() << "/" << pg->size() << ": " << env.source_name() << " ok, loss "
              << loss.item<float>() << ", buckets " << model.stats().num_buckets << ", backend " << pg->backend_name()
              << ", local " << env.local_rank << "/" << env.local_world_size << std::endl;
    ddp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
