// Ported tests of what a forward returns (nested tuples, lists and dicts,
// tensors made in the forward, a map among them) and of static_graph (a graph
// that changes is an error at PyTorch's moments).
#include "ported_case.h"

namespace ddp::testing::ported {

// Outputs nested in a tuple, a list or a dict, as c10::IValue.
struct NestedOutputModuleImpl : nn::Module {
  NestedOutputModuleImpl() : lin(register_module("lin", nn::Linear(nn::LinearOptions(100, 1).bias(false)))) {}
  c10::IValue forward(torch::Tensor inp, const std::string& output_type) {
    if (output_type == "tuple")
      return c10::ivalue::Tuple::create({lin(inp), c10::ivalue::Tuple::create({lin(inp), lin(inp)})});
    if (output_type == "list") {
      c10::impl::GenericList inner(c10::AnyType::get()), outer(c10::AnyType::get());
      inner.push_back(lin(inp));
      inner.push_back(lin(inp));
      outer.push_back(lin(inp));
      outer.push_back(inner);
      return outer;
    }
    c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get());
    c10::impl::GenericDict outer(c10::StringType::get(), c10::AnyType::get());
    outer.insert("a", lin(inp));
    inner.insert("c", lin(inp));
    outer.insert("b", inner);
    return outer;
  }
  nn::Linear lin;
};
TORCH_MODULE(NestedOutputModule);

// The test's get_loss: `loss = 0.0; loss += get_loss(v)` for each value.
torch::Tensor get_loss(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().sum();
  std::vector<c10::IValue> values;
  if (v.isTuple()) values = v.toTupleRef().elements().vec();
  else if (v.isList()) values = v.toListRef().vec();
  else for (const auto& item : v.toGenericDict()) values.push_back(item.value());
  torch::Tensor loss;
  for (const auto& value : values) {
    if (!loss.defined()) loss = torch::add(get_loss(value), 0.0);
    else loss += get_loss(value);
  }
  return loss;
}

void test_ddp_static_graph_nested_types(Out& out, std::shared_ptr<ProcessGroup> pg) {
  NestedOutputModule plain, static_one;
  DistributedDataParallel model(init(plain), pg);
  DistributedDataParallel model_static_graph(init(static_one), pg, DDPOptions().static_graph(true));
  const auto inp = data({10, 100}, 3 + pg->rank());
  for (const std::string type : {"list", "tuple", "dict"}) {
    for (int i = 0; i < 6; ++i) {
      get_loss(model(inp, type)).backward();
      step(*plain);
      const c10::IValue out_static = model_static_graph(inp, type);
      EXPECT_OR_FAIL(type == "tuple" ? out_static.isTuple() : type == "list" ? out_static.isList()
                                                                            : out_static.isGenericDict(),
                     "the output keeps its type");
      get_loss(out_static).backward();
      step(*static_one);
      out.params(type + fmt(" iteration %d", i), *plain);
      out.params(type + fmt(" iteration %d static_graph", i), *static_one);
    }
  }
}

// A forward that makes tensors of its own and returns them beside its
// output, one inside a map.
struct NewTensorModelImpl : nn::Module {
  NewTensorModelImpl() {
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
  }
  torch::Tensor init_opt() { return data({1, 10}, 100 + ++made); }
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, std::map<std::string, torch::Tensor>> forward(
      torch::Tensor x, c10::optional<torch::Tensor> opt_1, c10::optional<torch::Tensor> opt_2,
      c10::optional<torch::Tensor> opt_nested) {
    x = fc2(torch::relu(fc1(x)));
    return {x, opt_1 ? *opt_1 : init_opt(), opt_2 ? *opt_2 : init_opt(),
            {{"tensor", opt_nested ? *opt_nested : init_opt()}}};
  }
  nn::Linear fc1{nullptr}, fc2{nullptr};
  int made = 0;
};
TORCH_MODULE(NewTensorModel);

void ddp_new_tensor_in_fwd(Out& out, std::shared_ptr<ProcessGroup> pg, bool static_graph) {
  NewTensorModel model;
  init(model);
  for (int find_unused : {1, 0}) {
    DistributedDataParallel ddp(
        model, pg,
        DDPOptions().broadcast_buffers(false).find_unused_parameters(find_unused).static_graph(static_graph));
    c10::optional<torch::Tensor> opt_1, opt_2;  // the test's opt[2] is a dict after the first call: never a tensor
    for (int i = 0; i < 2; ++i) {
      model->zero_grad();
      auto [result, o1, o2, nested] = ddp(data({1, 10}, 10 * i + pg->rank()), opt_1, opt_2, c10::nullopt);
      opt_1 = o1;
      opt_2 = o2;
      out.tensor(fmt("find_unused=%d iteration %d opt 0", find_unused, i), o1);
      out.tensor(fmt("find_unused=%d iteration %d opt 1", find_unused, i), o2);
      out.tensor(fmt("find_unused=%d iteration %d opt 2", find_unused, i), nested.at("tensor"));
      result.mean().backward();
      out.grads(fmt("find_unused=%d iteration %d", find_unused, i), *model);
    }
  }
}

void test_ddp_new_tensor_in_fwd(Out& out, std::shared_ptr<ProcessGroup> pg) { ddp_new_tensor_in_fwd(out, pg, false); }

void test_ddp_new_tensor_in_fwd_static_graph(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_new_tensor_in_fwd(out, pg, true);
}

void ddp_invalid_static_graph(Out& out, std::shared_ptr<ProcessGroup> pg, const torch::Tensor& first,
                              const torch::Tensor& second, const std::string& label) {
  ControlFlowToyModel net;
  DistributedDataParallel model(init(net), pg, DDPOptions().static_graph(true));
  const std::vector<torch::Tensor> inputs = {first, second, first};
  for (int i = 0; i < 3; ++i) outcome(out, label + fmt(" iteration %d", i), [&] { return model(inputs[i]); });
}

void test_invalid_static_graph(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const auto random_input = data({20, 10}, pg->rank()), ones_input = torch::ones({20, 10});
  ddp_invalid_static_graph(out, pg, random_input, ones_input, "unused then used");
  ddp_invalid_static_graph(out, pg, ones_input, random_input, "used then unused");
}

struct TwoForwardNetImpl : nn::Module {
  TwoForwardNetImpl() : lin(register_module("lin", nn::Linear(10, 10))) { register_module("relu", nn::ReLU()); }
  torch::Tensor forward(torch::Tensor x) { return torch::relu(lin(x)); }
  nn::Linear lin;
};
TORCH_MODULE(TwoForwardNet);

void test_static_graph_multi_forward(Out& out, std::shared_ptr<ProcessGroup> pg) {
  TwoForwardNet net;
  DistributedDataParallel model(init(net, pg->rank()), pg, DDPOptions().static_graph(true));
  const auto inp = torch::ones({2, 10});
  for (int i = 0; i < 3; ++i) {
    net->zero_grad();
    auto a = model(inp);
    auto b = model(inp);
    (a.sum() + b.sum()).backward();
    out.grads(fmt("iteration %d", i), *net);
  }
}

Cases output_and_static_graph_cases() {
  return {
      {"test_ddp_static_graph_nested_types", test_ddp_static_graph_nested_types},
      {"test_ddp_new_tensor_in_fwd", test_ddp_new_tensor_in_fwd},
      {"test_ddp_new_tensor_in_fwd_static_graph", test_ddp_new_tensor_in_fwd_static_graph},
      {"test_invalid_static_graph", test_invalid_static_graph},
      {"test_static_graph_multi_forward", test_static_graph_multi_forward},
  };
}

}  // namespace ddp::testing::ported
