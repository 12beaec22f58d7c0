// The kit's input path on CPUs: how many samples per second the loader
// alone delivers (ddp::TensorDataset, ddp::DistributedSampler,
// torch::data's loader, through ddp::Prefetcher as train_epoch takes them),
// against how many the LeNet example's step consumes on the same machine
// (forward, backward and SGD of the seed's LeNet, one process), each run
// after the other, --runs times.
//
//   ddp_bench_loader [--data-dir DIR] [--batch 256] [--workers 0] [--runs 3] [--steps 60]
//
// Without the data set (DIR or the kit's default), random images of its
// shape. Prints one RESULT line per run: loader_samples_s, step_samples_s
// and their ratio.
#include <ddp/ddp.h>
#include <ddp/data/fashion_mnist.h>
#include <ddp/data/tensor_dataset.h>
#include <ddp/train/prefetch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "models.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = ddp::default_fashion_mnist_dir();
  int64_t batch = 256, workers = 0, runs = 3, steps = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--data-dir") data_dir = v;
    else if (k == "--batch") batch = std::stoll(v);
    else if (k == "--workers") workers = std::stoll(v);
    else if (k == "--runs") runs = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else {
      std::cerr << "usage: ddp_bench_loader [--data-dir DIR] [--batch N] [--workers N] [--runs N] [--steps N]\n";
      return 2;
    }
  }
  torch::Tensor images, labels;
  std::string source = data_dir;
  try {
    auto train = ddp::read_fashion_mnist(data_dir, ddp::Split::Train);
    images = train.images;
    labels = train.labels;
  } catch (const std::exception&) {
    source = "random images of Fashion-MNIST's shape";
    images = torch::rand({60000, 1, 28, 28});
    labels = torch::randint(10, {60000}, torch::kLong);
  }
  ddp::TensorDataset set(images, labels);
  std::cout << "data: " << source << ", batch " << batch << ", workers " << workers << ", threads "
            << torch::get_num_threads() << std::endl;
  bench::LeNet net;
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  for (int64_t run = 0; run < runs; ++run) {
    ddp::DistributedSampler sampler(set.size().value(), 1, 0, ddp::DistributedSamplerOptions().seed(run));
    auto loader = torch::data::make_data_loader(set, sampler, torch::data::DataLoaderOptions(batch).workers(workers));
    // The loader alone: one whole epoch.
    int64_t delivered = 0;
    auto t0 = Clock::now();
    {
      ddp::Prefetcher<std::remove_reference_t<decltype(*loader)>> batches(*loader, torch::kCPU);
      while (auto b = batches.next()) delivered += b->data.size(0);
    }
    const double loader_rate = static_cast<double>(delivered) / seconds_since(t0);
    // The example's step on the same batches, fed the same way.
    int64_t consumed = 0, taken = 0;
    t0 = Clock::now();
    {
      ddp::Prefetcher<std::remove_reference_t<decltype(*loader)>> batches(*loader, torch::kCPU);
      while (taken < steps) {
        auto b = batches.next();
        if (!b) break;
        optimizer.zero_grad();
        torch::nn::functional::cross_entropy(net->forward(b->data), b->target).backward();
        optimizer.step();
        consumed += b->data.size(0);
        ++taken;
      }
    }
    const double step_rate = static_cast<double>(consumed) / seconds_since(t0);
    std::printf("RESULT run=%lld loader_samples_s=%.0f step_samples_s=%.0f ratio=%.2f\n", static_cast<long long>(run),
                loader_rate, step_rate, loader_rate / step_rate);
    std::fflush(stdout);
  }
  return 0;
}
