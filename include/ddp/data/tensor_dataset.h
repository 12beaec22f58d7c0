// A dataset of (input, target) tensors whose first dimension indexes the
// samples. A batch is one index_select per tensor, not one get() and a stack
// per sample, so a LibTorch DataLoader over it costs next to nothing.
//
//   ddp::TensorDataset train(images, labels);
//   auto loader = torch::data::make_data_loader(train, sampler, torch::data::DataLoaderOptions(128));
//   for (auto& batch : *loader) { batch.data; batch.target; }
#pragma once

#include <torch/torch.h>

#include <vector>

namespace ddp {

class TensorDataset
    : public torch::data::datasets::BatchDataset<TensorDataset, torch::data::Example<>, std::vector<size_t>> {
 public:
  // Both tensors must have the same first dimension.
  TensorDataset(torch::Tensor data, torch::Tensor target);

  torch::data::Example<> get_batch(std::vector<size_t> indices) override;
  c10::optional<size_t> size() const override;

  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& target() const { return target_; }

 private:
  torch::Tensor data_, target_;
};

}  // namespace ddp
