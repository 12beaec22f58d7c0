// The DataParallel tutorial's random data set (seed 003), distributed: 100
// random samples of size 5, a Linear(5, 2), a batch of 30. Each rank prints
// the input and output sizes it sees: with 2 processes, every rank gets 15
// of the 30 samples a step (and 5 of the last 10), as the tutorial's two
// GPUs did, but each in its own process.
//
//   ddprun --nproc-per-node 2 build/examples/random_linear/random_linear
#include <ddp/train.h>

#include <iostream>
#include <sstream>

struct ModelImpl : torch::nn::Module {
  ModelImpl(int64_t input_size, int64_t output_size) : fc(register_module("fc", torch::nn::Linear(input_size, output_size))) {}

  torch::Tensor forward(torch::Tensor input, int rank) {
    auto output = fc(input);
    std::ostringstream line;
    line << "\tIn Model (rank " << rank << "): input size " << input.sizes() << " output size " << output.sizes();
    std::cout << line.str() << std::endl;
    return output;
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Model);

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    const int64_t input_size = 5, output_size = 2, data_size = 100;
    const auto opts = ddp::parse_train_options(
        argc, argv,
        ddp::TrainOptions()
            .epochs(1)
            .global_batch_size(30)
            .lr(0.01)
            .run_dir("runs/random_linear")
            // No data files, checkpoints, data loader threads, mixed precision or epoch loop of the kit's here;
            // --run-dir is where --timeline writes.
            .supports({"epochs", "batch-size", "global-batch-size", "lr", "seed", "backend", "bucket-cap-mb",
                       "timeout", "run-dir", "limit-batches", "timeline", "timeline-skew-every"}));
    auto pg = opts.init_process_group();
    const int rank = pg->rank(), world = pg->size();
    if (rank == 0) std::cout << ddp::environment_summary(*pg) << "Let's use " << world << " processes!" << std::endl;
    else ddp::environment_summary(*pg);

    // The same random data on every rank (same seed); the sampler splits it.
    torch::manual_seed(opts.seed());
    ddp::TensorDataset data(torch::randn({data_size, input_size}), torch::zeros({data_size}));
    ddp::DistributedSampler sampler(data_size, *pg, ddp::DistributedSamplerOptions().seed(opts.seed()));
    const int64_t batch = opts.per_process_batch(world);
    auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(batch));

    Model net(input_size, output_size);
    net->to(pg->device());
    ddp::DistributedDataParallel model(net, pg, opts.ddp_options());
    torch::optim::SGD optimizer(net->parameters(), opts.lr());

    for (int64_t epoch = 0; epoch < opts.epochs(); ++epoch) {
      sampler.set_epoch(epoch);
      int64_t step = 0;
      const int64_t steps = opts.steps_per_epoch(sampler.num_samples(), batch);
      for (auto& b : *loader) {
        if (step++ == steps) break;
        auto input = b.data.to(pg->device());
        optimizer.zero_grad();
        auto output = model(input, rank);
        output.pow(2).mean().backward();  // any loss: DDP averages its gradients over the ranks
        ddp::optimizer_step(model, optimizer);
        std::cout << "Outside (rank " << rank << "): input size " << input.sizes() << " output_size " << output.sizes()
                  << std::endl;
      }
    }
    ddp::destroy_process_group();
    return 0;
  });
}
