// One parameter's optimizer state as named tensors and a step, and back, for
// LibTorch's SGD, Adam, AdamW, Adagrad and RMSprop: what a sharded
// checkpoint writes per parameter (sharded_checkpoint.cpp) and what the
// background writer stages (checkpoint_writer.cpp). Private.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp::detail {

struct ParamStateParts {
  std::optional<int64_t> step;                               // Adam, AdamW, Adagrad, RMSprop
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // the defined ones, by field name
};

// "sgd", "adam", "adamw", "adagrad", "rmsprop"; "" for another optimizer.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

// The parts of a state of one of those kinds; nullopt for another kind.
std::optional<ParamStateParts> parts_of_state(const torch::optim::OptimizerParamState& state);

// A copy of `state` whose tensors are copy(tensor) (a staged copy); null for
// a state of another kind.
std::unique_ptr<torch::optim::OptimizerParamState> copy_state(
    const torch::optim::OptimizerParamState& state, const std::function<at::Tensor(const at::Tensor&)>& copy);

// The state of an optimizer of `kind` from its parts. CheckpointError
// naming `what` for a field that kind has not, or a step it lacks.
std::unique_ptr<torch::optim::OptimizerParamState> state_of_parts(const std::string& kind, const ParamStateParts& parts,
                                                                  const std::string& what);

// An optimizer of `kind` over `groups`, with its default options (a
// checkpoint's saved options replace them).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind,
                                                        std::vector<torch::optim::OptimizerParamGroup> groups);

}  // namespace ddp::detail
