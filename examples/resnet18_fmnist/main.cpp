// ResNet-18 on Fashion-MNIST resized to 96x96 (seed 002's d2l.ai chapter),
// data-parallel. Meant for GPUs (ddprun gives each process its own; NCCL is
// picked automatically); on CPUs use --limit-batches for a quick look.
//
//   ddprun --nproc-per-node 2 build/examples/resnet18_fmnist/resnet18_fmnist [--sync-bn]
#include <ddp/train.h>

#include "resnet18.h"

#include <algorithm>
#include <cstdio>

using resnet18_fmnist::ResNet18;

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    // 1. Options: the seed's two-GPU run (batch 512, lr 0.2, 10 epochs, images resized to 96).
    // Both of its own may change on a resume: the parameters' shapes and names stay the same.
    const auto opts = ddp::parse_train_options(
        argc, argv,
        ddp::TrainOptions()
            .epochs(10)
            .global_batch_size(512)
            .lr(0.2)
            .data_dir(ddp::default_fashion_mnist_dir())
            .run_dir("runs/resnet18_fmnist")
            .add_option("image-size", 96, "images are resized to this many pixels a side", ddp::OnResume::may_change)
            .add_option("sync-bn", false, "BatchNorm statistics over every rank's batch (ddp::SyncBatchNorm), not "
                        "each rank's own", ddp::OnResume::may_change)
            .supports({"epochs", "batch-size", "global-batch-size", "lr", "seed", "backend", "bucket-cap-mb",
                       "timeout", "recovery-deadline", "data-dir", "run-dir", "checkpoint-every", "resume",
                       "workers", "limit-batches", "timeline", "timeline-skew-every", "preemption-check-every",
                       "nonfinite-loss", "amp", "log-samples"}));
    const int64_t image_size = opts.get<int64_t>("image-size");
    const bool sync_bn = opts.get<bool>("sync-bn");
    auto pg = opts.init_process_group();
    const int world = pg->size();
    const torch::Device device = pg->device();
    ddp::RunDir run(opts.run_dir(), *pg);
    run.log(ddp::environment_summary(*pg));

    // 2. Data, resized per batch on the training device (60000 images at 96x96 would take 2 GiB up front).
    auto train = ddp::read_fashion_mnist(opts.data_dir(), ddp::Split::Train);
    auto test = ddp::read_fashion_mnist(opts.data_dir(), ddp::Split::Test);
    ddp::TensorDataset train_set(train.images, train.labels), test_set(test.images, test.labels);
    ddp::DistributedSampler train_sampler(train_set.size().value(), *pg,
                                          ddp::DistributedSamplerOptions().seed(opts.seed()));
    ddp::DistributedSampler test_sampler(test_set.size().value(), *pg,
                                         ddp::DistributedSamplerOptions().shuffle(false).pad(false));
    const int64_t batch = opts.per_process_batch(world);
    auto loader_options = torch::data::DataLoaderOptions(batch).workers(opts.workers());
    auto train_loader = torch::data::make_data_loader(train_set, train_sampler, loader_options);
    auto test_loader = torch::data::make_data_loader(test_set, test_sampler, loader_options);
    auto resize = [&](const torch::Tensor& x) {
      return torch::nn::functional::interpolate(x.to(device), torch::nn::functional::InterpolateFuncOptions()
                                                                  .size(std::vector<int64_t>{image_size, image_size})
                                                                  .mode(torch::kBilinear)
                                                                  .align_corners(false));
    };

    // 3. Model, DDP, optimizer.
    torch::manual_seed(opts.seed());
    ResNet18 net(10);
    // Before DDP, as PyTorch's: the same parameter and buffer names, so checkpoints load either way.
    if (sync_bn) ddp::convert_sync_batchnorm(net, pg);
    net->to(device);
    ddp::DistributedDataParallel model(net, pg, opts.ddp_options());
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(opts.lr()));
    // --amp: float16 autocast with the loss scaler on GPU; bfloat16 (--amp bf16, or auto on CPU) without.
    const auto amp_dtype = opts.autocast_dtype(device);
    ddp::GradScaler scaler(pg, ddp::GradScalerOptions().enabled(opts.amp() && amp_dtype == torch::kHalf));

    // 4. Resume (the scaler's state travels with the checkpoint).
    ddp::TrainState state = ddp::resume_or_start(opts, run, *net, optimizer, *pg, &scaler);

    // 5. The loop. Evaluation runs the plain module on the resized test shard.
    struct Resized {
      ResNet18 net;
      std::function<torch::Tensor(const torch::Tensor&)> resize;
      torch::Tensor forward(const torch::Tensor& x) { return net->forward(resize(x)); }
      bool is_training() const { return net->is_training(); }
      void eval() { net->eval(); }
      void train(bool on) { net->train(on); }
      Resized* operator->() { return this; }
    } eval_net{net, resize};
    double best_acc = 0;
    for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
      const auto train = ddp::train_epoch(*train_loader, train_sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
        auto x = resize(b.data), y = b.target.to(device);
        optimizer.zero_grad();
        torch::Tensor loss;
        {
          ddp::Autocast autocast(device.type(), amp_dtype, opts.amp());
          loss = torch::nn::functional::cross_entropy(model(x), y);
        }
        scaler.scale(loss).backward();
        ddp::optimizer_step(model, optimizer, scaler);
        return loss;
      });
      const auto eval = ddp::evaluate_classifier(eval_net, *test_loader, *pg, opts.limit_batches());
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
