// What DistributedDataParallel can tell about weights tied the PyTorch way
// in LibTorch. PyTorch ties an output layer to its embedding with
// `head.weight = emb.weight`, which re-registers the parameter; LibTorch's
// `head->weight = emb->weight` changes only the member, the layer keeps its
// old registered tensor, and forward no longer uses that one: it gets no
// gradient. Tied properly (the shared tensor registered under both names),
// parameters() lists it twice and an optimizer built from that list steps it
// twice. Private to src/parallel/.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace ddp::detail {

// A built-in layer's tensor member (torch::nn::Linear's weight, ...) that is
// not the parameter the layer registered under the same name. Layers of the
// user's own types cannot be checked: their members are not known.
struct ReassignedMember {
  std::string parameter;  // the registered tensor's dotted name: "head.weight"
  std::string member;     // "head->weight"
  std::string now;        // what the member is now: "'emb.weight'", or words for a tensor that is no parameter
};

// Every reassigned member of the module's built-in layers; `intact`, when
// given, receives the dotted names of the parameters whose layer was checked
// and whose member is still the registered tensor.
std::vector<ReassignedMember> reassigned_members(const torch::nn::Module& module,
                                                 std::vector<std::string>* intact = nullptr);

// The tensors that require grad and that module.parameters() lists more than
// once, each as "'first.name' (also 'other.name')".
std::vector<std::string> parameters_listed_twice(const torch::nn::Module& module);

// At DistributedDataParallel's construction, on rank 0 (the model is the
// same on every rank): a warning on stderr for each of the above.
void warn_about_tied_weights(const torch::nn::Module& module, int rank);

// The advice that follows the names of parameters that received no gradient
// (Reducer::set_no_gradient_advice): the reassigned members among them, else
// the likely causes in order, a reassigned member first where it cannot be
// ruled out, then a parameter outside the loss (find_unused_parameters).
std::string no_gradient_advice(const torch::nn::Module& module, const std::vector<std::string>& names);

}  // namespace ddp::detail
