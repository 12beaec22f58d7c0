// The key of a parameter in a LibTorch optimizer's state(), for tests that
// compare two optimizers' states parameter by parameter.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace ddp::testing {

// LibTorch keys state() by the TensorImpl's address: as text up to some 2.x
// version, as the address itself after.
template <typename Map>
typename Map::key_type state_key(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return reinterpret_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace ddp::testing
