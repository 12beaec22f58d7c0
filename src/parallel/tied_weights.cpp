#include "parallel/tied_weights.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "ddp/nn/sync_batch_norm.h"

namespace ddp::detail {
namespace {

using Members = std::vector<std::pair<std::string, at::Tensor>>;

template <typename Impl>
bool weight_and_bias(const torch::nn::Module& m, Members& out) {
  const auto* layer = dynamic_cast<const Impl*>(&m);
  if (layer) out = {{"weight", layer->weight}, {"bias", layer->bias}};
  return layer != nullptr;
}

template <typename Impl>
bool weight_only(const torch::nn::Module& m, Members& out) {
  const auto* layer = dynamic_cast<const Impl*>(&m);
  if (layer) out = {{"weight", layer->weight}};
  return layer != nullptr;
}

// The parameter members of the layers whose forward is known to use them;
// empty for any other module.
Members parameter_members(const torch::nn::Module& m) {
  namespace nn = torch::nn;
  Members out;
  weight_and_bias<nn::LinearImpl>(m, out) || weight_and_bias<nn::BilinearImpl>(m, out) ||
      weight_and_bias<nn::Conv1dImpl>(m, out) || weight_and_bias<nn::Conv2dImpl>(m, out) ||
      weight_and_bias<nn::Conv3dImpl>(m, out) || weight_and_bias<nn::ConvTranspose1dImpl>(m, out) ||
      weight_and_bias<nn::ConvTranspose2dImpl>(m, out) || weight_and_bias<nn::ConvTranspose3dImpl>(m, out) ||
      weight_and_bias<nn::LayerNormImpl>(m, out) || weight_and_bias<nn::GroupNormImpl>(m, out) ||
      weight_and_bias<nn::BatchNorm1dImpl>(m, out) || weight_and_bias<nn::BatchNorm2dImpl>(m, out) ||
      weight_and_bias<nn::BatchNorm3dImpl>(m, out) || weight_and_bias<nn::InstanceNorm1dImpl>(m, out) ||
      weight_and_bias<nn::InstanceNorm2dImpl>(m, out) || weight_and_bias<nn::InstanceNorm3dImpl>(m, out) ||
      weight_and_bias<SyncBatchNormImpl>(m, out) || weight_only<nn::EmbeddingImpl>(m, out) ||
      weight_only<nn::EmbeddingBagImpl>(m, out) || weight_only<nn::PReLUImpl>(m, out);
  return out;
}

std::string explain(const ReassignedMember& r) {
  const auto dot = r.parameter.rfind('.');
  const std::string layer = dot == std::string::npos ? "the module" : r.parameter.substr(0, dot);
  return "'" + r.parameter + "' is not the tensor " + layer + "'s forward uses: its member " + r.member +
         " was assigned another tensor (now " + r.now +
         "), and a LibTorch module keeps the tensor it registered (Python's `head.weight = emb.weight` "
         "re-registers the parameter; LibTorch's `head->weight = emb->weight` changes only the member).";
}

// How to tie weights in LibTorch. A layer that registered "weight" already
// (torch::nn::Linear) refuses a second register_parameter("weight", ...).
constexpr const char* kHowToTie =
    "To tie weights, register the shared tensor itself under a name its module has not registered yet: "
    "an output layer of your own whose constructor calls register_parameter(\"weight\", emb->weight), or "
    "head_weight = register_parameter(\"head_weight\", emb->weight) in your model and "
    "torch::nn::functional::linear(x, head_weight, bias) in its forward (a torch::nn::Linear already "
    "registered a \"weight\", and LibTorch refuses a second). Build the optimizer from "
    "ddp::unique_parameters(model) (docs/training.md, \"Tied weights\").";

}  // namespace

std::vector<ReassignedMember> reassigned_members(const torch::nn::Module& module, std::vector<std::string>* intact) {
  std::unordered_map<const c10::TensorImpl*, std::string> first_name;
  for (const auto& p : module.named_parameters(true)) first_name.emplace(p.value().unsafeGetTensorImpl(), p.key());
  std::vector<ReassignedMember> out;
  for (const auto& m : module.named_modules("", /*include_self=*/true)) {
    const auto registered = m.value()->named_parameters(/*recurse=*/false);
    for (const auto& [name, member] : parameter_members(*m.value())) {
      const at::Tensor* own = registered.find(name);
      if (own == nullptr) continue;  // not registered (a Linear without bias)
      const std::string parameter = m.key().empty() ? name : m.key() + "." + name;
      if (member.unsafeGetTensorImpl() == own->unsafeGetTensorImpl()) {
        if (intact) intact->push_back(parameter);
        continue;
      }
      const auto it = first_name.find(member.unsafeGetTensorImpl());
      const std::string now = !member.defined()        ? "an undefined tensor"
                              : it != first_name.end() ? "'" + it->second + "'"
                                                       : "a tensor that is none of the module's parameters";
      out.push_back({parameter, (m.key().empty() ? "module" : m.key()) + "->" + name, now});
    }
  }
  return out;
}

std::vector<std::string> parameters_listed_twice(const torch::nn::Module& module) {
  std::map<const c10::TensorImpl*, size_t> index;
  std::vector<std::vector<std::string>> names;  // per tensor, in order of first appearance
  for (const auto& p : module.named_parameters(true)) {
    if (!p.value().requires_grad()) continue;  // an optimizer leaves it alone: it gets no gradient
    const auto [it, added] = index.emplace(p.value().unsafeGetTensorImpl(), names.size());
    if (added) names.emplace_back();
    names[it->second].push_back(p.key());
  }
  std::vector<std::string> out;
  for (const auto& n : names) {
    if (n.size() < 2) continue;
    std::string line = "'" + n[0] + "' (also";
    for (size_t i = 1; i < n.size(); ++i) line += (i > 1 ? ", '" : " '") + n[i] + "'";
    out.push_back(line + ")");
  }
  return out;
}

void warn_about_tied_weights(const torch::nn::Module& module, int rank) {
  if (rank != 0) return;
  const std::string who = "rank 0: DistributedDataParallel: warning: ";
  const auto twice = parameters_listed_twice(module);
  if (!twice.empty()) {
    std::ostringstream msg;
    msg << who << "module->parameters() lists " << twice.size() << " tensor(s) more than once: ";
    for (size_t i = 0; i < twice.size(); ++i) msg << (i ? ", " : "") << twice[i];
    msg << ". DDP reduces each tensor once, but an optimizer built from module->parameters() would step such a "
           "tensor once per listing (twice a step for a tied weight); build it from ddp::unique_parameters(module) "
           "(<ddp/nn/unique_parameters.h>).";
    std::cerr << msg.str() << std::endl;
  }
  for (const auto& r : reassigned_members(module))
    std::cerr << who << explain(r) << " It will get no gradient. " << kHowToTie << std::endl;
}

std::string no_gradient_advice(const torch::nn::Module& module, const std::vector<std::string>& names) {
  std::vector<std::string> intact;
  const auto reassigned = reassigned_members(module, &intact);
  auto among = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  std::ostringstream out;
  bool explained_all = true, member_ruled_out = true;
  size_t found = 0;
  for (const auto& name : names) {
    const auto r = std::find_if(reassigned.begin(), reassigned.end(),
                                [&](const ReassignedMember& m) { return m.parameter == name; });
    if (r != reassigned.end()) {
      out << (found++ ? "\n  " : "") << explain(*r);
      continue;
    }
    explained_all = false;
    if (!among(intact, name)) member_ruled_out = false;
  }
  if (found) out << "\n  " << kHowToTie;
  if (explained_all) return out.str();
  if (found) out << "\n  For the other parameters:";
  out << (found ? "\n  " : "") << "Likely causes:";
  if (!member_ruled_out)
    out << "\n  - a module member reassigned, as PyTorch code ties weights (head->weight = emb->weight): LibTorch "
           "changes only the member; the module keeps its old registered tensor, which forward no longer uses. "
           "Register the shared tensor itself instead: register_parameter(\"weight\", emb->weight) in a module "
           "that has not registered a \"weight\" (docs/training.md, \"Tied weights\").";
  out << "\n  - a parameter that does not contribute to the loss: make every parameter contribute, or construct "
         "with ddp::DDPOptions().find_unused_parameters(true).";
  return out.str();
}

}  // namespace ddp::detail
