// The models ddp_bench_lenet trains (--model lenet|d2l_lenet|mlp100|resnet18);
// bench/pytorch_lenet_bench.py builds the same ones, parameter for parameter.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "resnet18_fmnist/resnet18.h"

namespace bench {

// The seed's LeNet: conv 1->20 3x3, ReLU, avg-pool 2; conv 20->50 5x5, ReLU,
// avg-pool 2; flatten; linear 800->128, ReLU; linear 128->10.
struct LeNetImpl : torch::nn::Module {
  LeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 20, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(20, 50, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(800, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::avg_pool2d(torch::relu(conv1(x)), 2);  // 26x26 -> 13x13
    x = torch::avg_pool2d(torch::relu(conv2(x)), 2);  // 9x9 -> 4x4
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(LeNet);

// The classic d2l.ai LeNet of the seeds' multi-GPU chapter (61,706
// parameters): conv 1->6 5x5 padding 2, sigmoid, avg-pool 2; conv 6->16 5x5,
// sigmoid, avg-pool 2; linear 400->120->84->10 with sigmoids. A step costs
// about 18 ms of one core here, so communication and scheduling are a large
// share of it (docs/performance.md, "Small models").
struct D2lLeNetImpl : torch::nn::Module {
  D2lLeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(400, 120))),
        fc2(register_module("fc2", torch::nn::Linear(120, 84))),
        fc3(register_module("fc3", torch::nn::Linear(84, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::avg_pool2d(torch::sigmoid(conv1(x)), 2);  // 28x28 -> 14x14
    x = torch::avg_pool2d(torch::sigmoid(conv2(x)), 2);  // 10x10 -> 5x5
    x = torch::sigmoid(fc1(x.flatten(1)));
    x = torch::sigmoid(fc2(x));
    return fc3(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(D2lLeNet);

// About 100 MB of float parameters: 6 x Linear(2048, 2048) (25.2 M) + a head;
// MLP(4096): 100.7 M parameters.
struct MLPImpl : torch::nn::Module {
  static constexpr int kWidth = 2048;
  static constexpr int kLayers = 6;
  explicit MLPImpl(int width = kWidth) {
    for (int i = 0; i < kLayers; ++i)
      layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, width)));
    head = register_module("head", torch::nn::Linear(width, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l(x));
    return head(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(MLP);

// d2l.ai's ResNet-18, the resnet18_fmnist example's model (and the same in
// bench/pytorch_lenet_bench.py, parameter for parameter).
using resnet18_fmnist::ResNet18;

}  // namespace bench
