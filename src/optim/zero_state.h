// A ZeroRedundancyOptimizer's shard state moved between wrapped optimizers
// and through bytes: the pieces its consolidation, loading and re-sharding
// (zero_regroup.cpp) share.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace ddp::zero_state {

// The key of `param` in an optimizer's state(): LibTorch 1.13 to 2.x key it
// by the TensorImpl's address written as text (c10::guts::to_string); later
// versions by the address itself.
template <typename Map>
typename Map::key_type key_of(const Map&, const torch::Tensor& param) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << param.unsafeGetTensorImpl();
    return s.str();
  } else {
    return reinterpret_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Moves `param`'s state, if it has any, from one optimizer to another.
inline void move(torch::optim::Optimizer& from, torch::optim::Optimizer& to, const torch::Tensor& param) {
  auto& src = from.state();
  auto it = src.find(key_of(src, param));
  if (it == src.end()) return;
  to.state()[key_of(to.state(), param)] = std::move(it->second);
  src.erase(it);
}

// Copies it (a shallow copy: the same tensors), leaving `from` as it was.
inline void share(const torch::optim::Optimizer& from, torch::optim::Optimizer& to, const torch::Tensor& param) {
  const auto& src = from.state();
  auto it = src.find(key_of(src, param));
  if (it != src.end()) to.state()[key_of(to.state(), param)] = it->second->clone();
}

inline std::string to_bytes(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

inline void from_bytes(torch::optim::Optimizer& opt, const std::string& bytes, torch::Device device) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size(), device);
  opt.load(archive);
}

}  // namespace ddp::zero_state
