#include "ddp/nn/unique_parameters.h"

#include <unordered_set>

namespace ddp {

std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(const torch::nn::Module& module,
                                                                        bool recurse) {
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : module.named_parameters(recurse))
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  return out;
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module, bool recurse) {
  std::vector<at::Tensor> out;
  for (auto& named : unique_named_parameters(module, recurse)) out.push_back(std::move(named.second));
  return out;
}

}  // namespace ddp
