#include "param_state_parts.h"

#include "ddp/errors.h"

#include <algorithm>
#include <typeinfo>

namespace ddp::detail {

namespace {

using namespace torch::optim;
using Copy = std::function<at::Tensor(const at::Tensor&)>;

// One kind's fields: its name, its tensors (getter and setter by name) and
// whether it counts steps.
template <typename State>
struct Fields {
  using StateType = State;
  const char* kind;
  std::vector<std::pair<const char*, std::pair<const at::Tensor& (State::*)() const, State& (State::*)(const at::Tensor&)>>> tensors;
  bool has_step;
};

// LibTorch's TORCH_ARG getters and setters, by name.
#define DDP_FIELD(State, name) \
  std::make_pair(#name, std::make_pair(static_cast<const at::Tensor& (State::*)() const>(&State::name), \
                                       static_cast<State& (State::*)(const at::Tensor&)>(&State::name)))

const Fields<AdamParamState>& adam_fields() {
  static const Fields<AdamParamState> f{"adam",
                                        {DDP_FIELD(AdamParamState, exp_avg), DDP_FIELD(AdamParamState, exp_avg_sq),
                                         DDP_FIELD(AdamParamState, max_exp_avg_sq)},
                                        true};
  return f;
}
const Fields<AdamWParamState>& adamw_fields() {
  static const Fields<AdamWParamState> f{"adamw",
                                         {DDP_FIELD(AdamWParamState, exp_avg), DDP_FIELD(AdamWParamState, exp_avg_sq),
                                          DDP_FIELD(AdamWParamState, max_exp_avg_sq)},
                                         true};
  return f;
}
const Fields<SGDParamState>& sgd_fields() {
  static const Fields<SGDParamState> f{"sgd", {DDP_FIELD(SGDParamState, momentum_buffer)}, false};
  return f;
}
const Fields<AdagradParamState>& adagrad_fields() {
  static const Fields<AdagradParamState> f{"adagrad", {DDP_FIELD(AdagradParamState, sum)}, true};
  return f;
}
const Fields<RMSpropParamState>& rmsprop_fields() {
  static const Fields<RMSpropParamState> f{"rmsprop",
                                           {DDP_FIELD(RMSpropParamState, square_avg),
                                            DDP_FIELD(RMSpropParamState, momentum_buffer),
                                            DDP_FIELD(RMSpropParamState, grad_avg)},
                                           true};
  return f;
}
#undef DDP_FIELD

// Calls fn(fields) with the fields of the kind named, or of the state's
// exact type (typeid: AdamW's state is no Adam state); false for another.
template <typename Fn>
bool with_fields(const std::type_info& type, const std::string& kind, Fn&& fn) {
  auto is = [&](const auto& fields, const std::type_info& t) { return kind.empty() ? type == t : kind == fields.kind; };
  if (is(adam_fields(), typeid(AdamParamState))) return fn(adam_fields()), true;
  if (is(adamw_fields(), typeid(AdamWParamState))) return fn(adamw_fields()), true;
  if (is(sgd_fields(), typeid(SGDParamState))) return fn(sgd_fields()), true;
  if (is(adagrad_fields(), typeid(AdagradParamState))) return fn(adagrad_fields()), true;
  if (is(rmsprop_fields(), typeid(RMSpropParamState))) return fn(rmsprop_fields()), true;
  return false;
}

template <typename State>
int64_t step_of(const State& s) {
  if constexpr (std::is_same_v<State, SGDParamState>) {
    return 0;
  } else {
    return s.step();
  }
}

}  // namespace

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  const auto& t = typeid(optimizer);
  if (t == typeid(Adam)) return "adam";
  if (t == typeid(AdamW)) return "adamw";
  if (t == typeid(SGD)) return "sgd";
  if (t == typeid(Adagrad)) return "adagrad";
  if (t == typeid(RMSprop)) return "rmsprop";
  return "";
}

std::optional<ParamStateParts> parts_of_state(const OptimizerParamState& state) {
  std::optional<ParamStateParts> out;
  with_fields(typeid(state), "", [&](const auto& fields) {
    using State = typename std::decay_t<decltype(fields)>::StateType;
    const auto& s = static_cast<const State&>(state);
    ParamStateParts parts;
    if (fields.has_step) parts.step = step_of(s);
    for (const auto& [name, access] : fields.tensors)
      if (const auto& t = (s.*access.first)(); t.defined()) parts.tensors.emplace_back(name, t);
    out = std::move(parts);
  });
  return out;
}

std::unique_ptr<OptimizerParamState> copy_state(const OptimizerParamState& state, const Copy& copy) {
  std::unique_ptr<OptimizerParamState> out;
  with_fields(typeid(state), "", [&](const auto& fields) {
    using State = typename std::decay_t<decltype(fields)>::StateType;
    auto c = std::make_unique<State>(static_cast<const State&>(state));
    for (const auto& [name, access] : fields.tensors)
      if (const auto& t = ((*c).*access.first)(); t.defined()) ((*c).*access.second)(copy(t));
    out = std::move(c);
  });
  return out;
}

std::unique_ptr<OptimizerParamState> state_of_parts(const std::string& kind, const ParamStateParts& parts,
                                                    const std::string& what) {
  std::unique_ptr<OptimizerParamState> out;
  const bool known = with_fields(typeid(void), kind, [&](const auto& fields) {
    using State = typename std::decay_t<decltype(fields)>::StateType;
    auto s = std::make_unique<State>();
    for (const auto& part : parts.tensors) {
      const std::string& name = part.first;  // not a structured binding: lambdas capture it (C++17)
      auto it = std::find_if(fields.tensors.begin(), fields.tensors.end(),
                             [&](const auto& f) { return name == f.first; });
      if (it == fields.tensors.end())
        throw CheckpointError(what + ": \"" + name + "\" is no state of a " + kind + " optimizer; a corrupt or "
                              "crafted file?");
      ((*s).*(it->second.second))(part.second);
    }
    if constexpr (!std::is_same_v<State, SGDParamState>) {
      if (!parts.step) throw CheckpointError(what + ": no step for a " + kind + " optimizer's state; a corrupt file?");
      s->step(*parts.step);
    }
    out = std::move(s);
  });
  if (!known) throw CheckpointError(what + ": unknown optimizer kind \"" + kind + "\"; a corrupt or crafted file?");
  return out;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<OptimizerParamGroup> groups) {
  if (kind == "adam") return std::make_unique<Adam>(std::move(groups), AdamOptions());
  if (kind == "adamw") return std::make_unique<AdamW>(std::move(groups), AdamWOptions());
  if (kind == "sgd") return std::make_unique<SGD>(std::move(groups), SGDOptions(0.1));
  if (kind == "adagrad") return std::make_unique<Adagrad>(std::move(groups), AdagradOptions());
  if (kind == "rmsprop") return std::make_unique<RMSprop>(std::move(groups), RMSpropOptions());
  throw CheckpointError("unknown optimizer kind \"" + kind + "\"; a corrupt or crafted file?");
}

}  // namespace ddp::detail
