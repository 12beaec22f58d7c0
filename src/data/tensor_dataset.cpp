#include "ddp/data/tensor_dataset.h"

#include "ddp/errors.h"

namespace ddp {

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (!data_.defined() || !target_.defined() || data_.dim() == 0 || target_.dim() == 0 ||
      data_.size(0) != target_.size(0))
    throw UsageError("TensorDataset: data and target need the same first dimension (got " +
                                (data_.defined() ? std::to_string(data_.dim() ? data_.size(0) : 0) : "none") + " and " +
                                (target_.defined() ? std::to_string(target_.dim() ? target_.size(0) : 0) : "none") +
                                ")");
}

torch::data::Example<> TensorDataset::get_batch(std::vector<size_t> indices) {
  auto idx = torch::empty({static_cast<int64_t>(indices.size())}, torch::kLong);
  auto* p = idx.data_ptr<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) p[i] = static_cast<int64_t>(indices[i]);
  return {data_.index_select(0, idx), target_.index_select(0, idx)};
}

c10::optional<size_t> TensorDataset::size() const { return static_cast<size_t>(data_.size(0)); }

}  // namespace ddp
