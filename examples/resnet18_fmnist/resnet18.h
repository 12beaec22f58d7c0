// d2l.ai's ResNet-18 (seed 002's chapter) as a LibTorch module: the model of
// the resnet18_fmnist example, and of the benchmarks' --model resnet18
// (bench/lenet_bench.cpp; bench/pytorch_lenet_bench.py builds the same one,
// parameter for parameter). Needs Torch only.
#pragma once

#include <torch/torch.h>

namespace resnet18_fmnist {

namespace nn = torch::nn;

// d2l's Residual: two 3x3 convolutions with BatchNorm, and a 1x1 convolution
// on the shortcut when the shape changes. Its layers sit in the Sequential it
// derives from, under their own names (conv1, conv2, bn1, bn2, conv3: the
// state dict's), and forward calls them through it: there
// ddp::convert_sync_batchnorm (the example's --sync-bn) can swap a BatchNorm
// for a SyncBatchNorm, which it cannot in a typed member such as
// `nn::BatchNorm2d bn1;`, whose forward is not virtual.
struct ResidualImpl : nn::SequentialImpl {
  ResidualImpl(int64_t in, int64_t out, bool use_1x1conv, int64_t stride) {
    push_back("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).stride(stride)));
    push_back("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1)));
    push_back("bn1", nn::BatchNorm2d(out));
    push_back("bn2", nn::BatchNorm2d(out));
    if (use_1x1conv) push_back("conv3", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride)));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(layer(bn1, layer(conv1, x)));
    y = layer(bn2, layer(conv2, y));
    if (size() > conv3) x = layer(conv3, x);
    return torch::relu(y + x);
  }

 private:
  enum Layer : size_t { conv1, conv2, bn1, bn2, conv3 };  // positions in the Sequential
  torch::Tensor layer(Layer i, const torch::Tensor& x) { return begin()[i].forward(x); }
};
TORCH_MODULE(Residual);

inline nn::Sequential resnet_block(int64_t in, int64_t out, int num_residuals, bool first_block) {
  nn::Sequential blk;
  for (int i = 0; i < num_residuals; ++i) {
    if (i == 0 && !first_block)
      blk->push_back(Residual(in, out, true, 2));
    else
      blk->push_back(Residual(i == 0 ? in : out, out, false, 1));
  }
  return blk;
}

// The seed's resnet18(num_classes, in_channels=1): a 7x7 stem, four stages of
// two residuals, global average pooling, a linear layer. Linear and Conv2d
// weights normal(0, 0.01), as the seed's init_weights.
struct ResNet18Impl : nn::Module {
  explicit ResNet18Impl(int64_t num_classes = 10, int64_t in_channels = 1)
      : stem(register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in_channels, 64, 7).stride(2).padding(3)),
                                                    nn::BatchNorm2d(64), nn::ReLU(),
                                                    nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1))))),
        block1(register_module("resnet_block1", resnet_block(64, 64, 2, true))),
        block2(register_module("resnet_block2", resnet_block(64, 128, 2, false))),
        block3(register_module("resnet_block3", resnet_block(128, 256, 2, false))),
        block4(register_module("resnet_block4", resnet_block(256, 512, 2, false))),
        fc(register_module("fc", nn::Linear(512, num_classes))) {
    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<nn::Conv2d>()) conv->weight.normal_(0, 0.01);
      if (auto* linear = m->as<nn::Linear>()) linear->weight.normal_(0, 0.01);
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = block4->forward(block3->forward(block2->forward(block1->forward(stem->forward(x)))));
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  nn::Sequential stem, block1, block2, block3, block4;
  nn::Linear fc;
};
TORCH_MODULE(ResNet18);

}  // namespace resnet18_fmnist
