// A module's parameters, each tensor once: what an optimizer should be given
// when a weight is shared (an embedding tied to the output layer, a layer
// registered under two names). PyTorch's module.parameters() yields a shared
// tensor once; LibTorch's parameters() lists it once per registration, and a
// LibTorch optimizer built from that list steps it once per listing.
//
//   auto net = std::make_shared<LanguageModel>();   // head registers emb->weight
//   torch::optim::SGD opt(ddp::unique_parameters(net), 0.1);   // not net->parameters()
//
// Tensors are the same when they are the same TensorImpl (PyTorch's identity);
// two tensors that merely share storage are two parameters, as in PyTorch.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

// The module's parameters (its children's too, with recurse), each tensor
// once, in the order of its first appearance in module.parameters(recurse).
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module, bool recurse = true);

// The same, with each tensor's first name in named_parameters(recurse), as
// Python's named_parameters() and DistributedDataParallel name them.
std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const torch::nn::Module& module,
                                                                        bool recurse = true);

// For a std::shared_ptr<Net> or a module holder (torch::nn::Sequential, TORCH_MODULE types).
template <typename M>
std::vector<at::Tensor> unique_parameters(const std::shared_ptr<M>& module, bool recurse = true) {
  return unique_parameters(static_cast<const torch::nn::Module&>(*module), recurse);
}
template <typename C>
std::vector<at::Tensor> unique_parameters(const torch::nn::ModuleHolder<C>& module, bool recurse = true) {
  return unique_parameters(static_cast<const torch::nn::Module&>(*module), recurse);
}
template <typename M>
std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const std::shared_ptr<M>& module,
                                                                        bool recurse = true) {
  return unique_named_parameters(static_cast<const torch::nn::Module&>(*module), recurse);
}
template <typename C>
std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const torch::nn::ModuleHolder<C>& module,
                                                                        bool recurse = true) {
  return unique_named_parameters(static_cast<const torch::nn::Module&>(*module), recurse);
}

}  // namespace ddp
