// LeNet on Fashion-MNIST, data-parallel over every process ddprun starts
// (the d2l.ai chapter of seed 002, with DistributedDataParallel in place of
// the hand-written scatter and all-reduce).
//
//   ddprun --nproc-per-node 2 build/examples/lenet_fmnist/lenet_fmnist
#include <ddp/train.h>

#include <algorithm>
#include <cstdio>

// conv 1->20 3x3, ReLU, avg-pool 2; conv 20->50 5x5, ReLU, avg-pool 2;
// linear 800->128, ReLU; linear 128->10. Weights normal(0, 0.01), biases zero.
struct LeNetImpl : torch::nn::Module {
  LeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 20, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(20, 50, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(800, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.key().find("weight") != std::string::npos)
        p.value().normal_(0.0, 0.01);
      else
        p.value().zero_();
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::avg_pool2d(torch::relu(conv1(x)), 2);   // [N, 20, 13, 13]
    x = torch::avg_pool2d(torch::relu(conv2(x)), 2);   // [N, 50, 4, 4]
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(LeNet);

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    // 1. Options (the seed's: global batch 256, lr 0.2, 10 epochs) and the process group.
    const auto opts = ddp::parse_train_options(argc, argv,
                                               ddp::TrainOptions()
                                                   .epochs(10)
                                                   .global_batch_size(256)
                                                   .lr(0.2)
                                                   .data_dir(ddp::default_fashion_mnist_dir())
                                                   .run_dir("runs/lenet_fmnist")
                                                   // Every kit option: this example implements them all.
                                                   .supports({"epochs", "batch-size", "global-batch-size", "lr",
                                                              "seed", "backend", "bucket-cap-mb", "timeout",
                                                              "recovery-deadline", "data-dir", "run-dir",
                                                              "checkpoint-every", "resume",
                                                              "workers", "limit-batches", "timeline",
                                                              "timeline-skew-every", "preemption-check-every",
                                                              "nonfinite-loss", "amp", "log-samples"}));
    auto pg = opts.init_process_group();
    const int world = pg->size();
    const torch::Device device = pg->device();
    ddp::RunDir run(opts.run_dir(), *pg);
    run.log(ddp::environment_summary(*pg));

    // 2. Data: every rank reads the files; the samplers pick its share.
    auto train = ddp::read_fashion_mnist(opts.data_dir(), ddp::Split::Train);
    auto test = ddp::read_fashion_mnist(opts.data_dir(), ddp::Split::Test);
    ddp::TensorDataset train_set(train.images, train.labels), test_set(test.images, test.labels);
    ddp::DistributedSampler train_sampler(train_set.size().value(), *pg,
                                          ddp::DistributedSamplerOptions().seed(opts.seed()));
    ddp::DistributedSampler test_sampler(test_set.size().value(), *pg,
                                         ddp::DistributedSamplerOptions().shuffle(false).pad(false));
    const int64_t batch = opts.per_process_batch(world);
    auto train_loader = torch::data::make_data_loader(
        train_set, train_sampler, torch::data::DataLoaderOptions(batch).workers(opts.workers()));
    auto test_loader = torch::data::make_data_loader(test_set, test_sampler,
                                                     torch::data::DataLoaderOptions(batch).workers(opts.workers()));

    // 3. Model: the same seed on every rank (DDP also broadcasts rank 0's weights), DDP, optimizer.
    torch::manual_seed(opts.seed());
    LeNet net;
    net->to(device);
    ddp::DistributedDataParallel model(net, pg, opts.ddp_options());
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(opts.lr()));
    // --amp: float16 autocast with the loss scaler on GPU; bfloat16 (--amp bf16, or auto on CPU) without.
    const auto amp_dtype = opts.autocast_dtype(device);
    ddp::GradScaler scaler(pg, ddp::GradScalerOptions().enabled(opts.amp() && amp_dtype == torch::kHalf));

    // 4. Resume: model, optimizer, scaler, epoch, step, sampler epoch and RNG state.
    ddp::TrainState state = ddp::resume_or_start(opts, run, *net, optimizer, *pg, &scaler);
    run.log("lenet_fmnist: " + std::to_string(world) + " x " + std::to_string(batch) + " samples per step, lr " +
            std::to_string(opts.lr()) + ", epochs " + std::to_string(state.epoch + 1) + ".." +
            std::to_string(opts.epochs()));

    // 5. The loop.
    double best_acc = 0;
    for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
      const auto train = ddp::train_epoch(*train_loader, train_sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
        auto x = b.data.to(device), y = b.target.to(device);
        optimizer.zero_grad();
        torch::Tensor loss;
        {
          ddp::Autocast autocast(device.type(), amp_dtype, opts.amp());
          loss = torch::nn::functional::cross_entropy(model(x), y);
        }
        scaler.scale(loss).backward();  // gradients are averaged over the ranks when it returns
        ddp::optimizer_step(model, optimizer, scaler);
        return loss;
      });
      const auto eval = ddp::evaluate_classifier(net, *test_loader, *pg, opts.limit_batches());
      best_acc = std::max(best_acc, eval.accuracy());
      ddp::end_epoch(epoch, train, eval.loss(), eval.accuracy(), ddp::classifier_epoch_line(train, eval), *net, optimizer,
                     opts, state, run, *pg);
    }

    // 6. What the run leaves behind.
    char best[96];
    std::snprintf(best, sizeof best, "best test acc %.4f", best_acc);
    ddp::save_ddp_logging_data(run, model, *pg);
    ddp::finish_run(run, *net, *pg, best);
    ddp::destroy_process_group();
    return 0;
  });
}
