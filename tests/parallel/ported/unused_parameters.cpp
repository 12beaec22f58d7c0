// Ported tests of parameters that get no gradient: find_unused_parameters,
// control flow that differs across iterations and ranks, outputs left out of
// the loss, the error without find_unused_parameters (at the next forward),
// ignored parameters.
#include "ported_case.h"

namespace ddp::testing::ported {

struct IgnoreModelImpl : nn::Module {
  explicit IgnoreModelImpl(int rank) {
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(1, 1).bias(false)));
    fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(rank == 0 ? 1 : 10, 10).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(fc1(x)); }
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(IgnoreModel);

void ddp_ignore_params_arg(Out& out, std::shared_ptr<ProcessGroup> pg, bool static_graph) {
  const int rank = pg->rank();
  for (int find_unused : {0, 1}) {
    for (int broadcast_buffers : {0, 1}) {
      const auto label = fmt("static_graph=%d find_unused=%d broadcast_buffers=%d", static_graph, find_unused,
                             broadcast_buffers);
      IgnoreModel model(rank);
      init(model, rank);
      model->fc2->register_buffer("ignore_buffer", torch::zeros({5 + rank}));
      const auto proxy = model->fc2->weight;
      DistributedDataParallel ddp(model, pg,
                                  DDPOptions()
                                      .params_and_buffers_to_ignore({"fc2.weight", "fc2.ignore_buffer"})
                                      .find_unused_parameters(find_unused)
                                      .broadcast_buffers(broadcast_buffers)
                                      .static_graph(static_graph));
      model->fc2 = model->replace_module("fc2", nn::Linear(nn::LinearOptions(1, 1).bias(false)));
      init(model->fc2, 3 + rank);
      const auto inp = torch::ones({1}) * (rank + 1);
      for (int it = 0; it < 6; ++it) {
        ddp(inp).sum().backward();
        out.grads(label + fmt(" iteration %d", it), *model);
        out.text(label + fmt(" iteration %d proxy grad", it), proxy.grad().defined() ? "set" : "none");
      }
    }
  }
}

void test_ddp_ignore_params_arg(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_ignore_params_arg(out, pg, false);
  ddp_ignore_params_arg(out, pg, true);
}

struct TwoLinearImpl : nn::Module {
  TwoLinearImpl() {
    net1 = register_module("net1", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    net2 = register_module("net2", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return net1(x); }
  nn::Linear net1{nullptr}, net2{nullptr};
};
TORCH_MODULE(TwoLinear);

void test_ddp_unused_params_rebuild_buckets_exception(Out& out, std::shared_ptr<ProcessGroup> pg) {
  TwoLinear model;
  DistributedDataParallel ddp(init(model), pg);
  ddp(data({1, 10}, 0)).sum().backward();
  out.text("iteration 0", "returned");
  const auto message = raised(out, "iteration 1", [&] { ddp(data({1, 10}, 1)).sum().backward(); });
  expect_names(message, {"prior iteration", "'net2.weight'", "find_unused_parameters(true)"});
  EXPECT_OR_FAIL(message.find("net1.weight") == std::string::npos, "the used parameter is not named: " + message);
}

// net1's bias is the model's own `bias`: one tensor, two names.
struct SharedBiasLinearImpl : nn::Module {
  explicit SharedBiasLinearImpl(torch::Tensor shared) {
    weight = register_parameter("weight", torch::empty({5, 10}));
    bias = register_parameter("bias", shared);
  }
  torch::Tensor forward(torch::Tensor x) { return torch::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(SharedBiasLinear);

struct SharedBiasModelImpl : nn::Module {
  SharedBiasModelImpl() {
    bias = register_parameter("bias", torch::zeros({5}));
    net1 = register_module("net1", SharedBiasLinear(bias));
    net2 = register_module("net2", nn::Linear(10, 5));
  }
  torch::Tensor forward(torch::Tensor x) { return net2(x).sum(); }
  torch::Tensor bias;
  SharedBiasLinear net1{nullptr};
  nn::Linear net2{nullptr};
};
TORCH_MODULE(SharedBiasModel);

void test_ddp_shared_grad_acc_unused_params(Out& out, std::shared_ptr<ProcessGroup> pg) {
  for (int static_graph : {1, 0}) {
    SharedBiasModel model;
    DistributedDataParallel ddp_model(
        init(model), pg, DDPOptions().find_unused_parameters(true).static_graph(static_graph));
    const auto inp = data({20, 10}, pg->rank());
    for (int i = 0; i < 6; ++i) {
      auto loss = ddp_model(inp);
      loss.div_(10);
      loss.backward();
      out.grads(fmt("static_graph=%d iteration %d", static_graph, i), *model);
    }
  }
}

struct ControlFlowModelImpl : nn::Module {
  explicit ControlFlowModelImpl(int rank) : rank(rank) {
    lin1 = register_module("lin1", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    lin2 = register_module("lin2", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    const bool use_second_layer = torch::equal(x, torch::ones({20, 10})) && rank == 1;
    if (use_second_layer) return lin2(torch::relu(lin1(x)));
    return torch::relu(lin1(x));
  }
  int rank;
  nn::Linear lin1{nullptr}, lin2{nullptr};
};
TORCH_MODULE(ControlFlowModel);

void test_ddp_control_flow_different_across_ranks(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  const auto random_input = data({20, 10}, rank), ones_input = torch::ones({20, 10});
  {
    ControlFlowModel net(rank);
    DistributedDataParallel model(init(net), pg, DDPOptions().find_unused_parameters(true));
    for (int i = 0; i < 6; ++i) {
      model(i % 2 == 0 ? random_input : ones_input).sum().backward();
      out.grads(fmt("iteration %d", i), *net);
    }
  }
  ControlFlowModel net(rank);
  DistributedDataParallel model(init(net), pg, DDPOptions().find_unused_parameters(false));
  model(random_input).sum().backward();
  const auto message = raised(out, "find_unused_parameters=False iteration 1",
                              [&] { model(random_input).sum().backward(); });
  expect_names(message, {"prior iteration", "'lin2.weight'", "find_unused_parameters(true)"});
}

void test_ddp_control_flow_same_across_ranks(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const auto random_input = data({20, 10}, pg->rank()), ones_input = torch::ones({20, 10});
  {
    ControlFlowToyModel net;
    DistributedDataParallel model(init(net), pg, DDPOptions().find_unused_parameters(true));
    for (int i = 0; i < 6; ++i) {
      model(i % 2 == 0 ? random_input : ones_input).sum().backward();
      out.grads(fmt("iteration %d", i), *net);
    }
  }
  ControlFlowToyModel net;
  DistributedDataParallel model(init(net), pg, DDPOptions().find_unused_parameters(false));
  model(random_input).sum().backward();
  const auto message = raised(out, "find_unused_parameters=False iteration 1",
                              [&] { model(random_input).sum().backward(); });
  expect_names(message, {"prior iteration", "'lin2.weight'", "find_unused_parameters(true)"});
}

struct DetachedOutputModelImpl : nn::Module {
  DetachedOutputModelImpl() {
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    x = fc2(torch::relu(fc1(x)));
    auto y = x.clone();
    return {x.detach(), y};
  }
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DetachedOutputModel);

void test_ddp_returns_tensor_with_no_grad(Out& out, std::shared_ptr<ProcessGroup> pg) {
  DetachedOutputModel model;
  init(model);
  const auto inp = data({1, 10}, pg->rank());
  for (int find_unused : {1, 0}) {
    for (int static_graph : {1, 0}) {
      DistributedDataParallel ddp(
          model, pg, DDPOptions().find_unused_parameters(find_unused).static_graph(static_graph));
      for (int i = 0; i < 6; ++i) {
        auto [x, y] = ddp(inp);
        out.text(fmt("find_unused=%d static_graph=%d iteration %d out[0].requires_grad", find_unused, static_graph, i),
                 x.requires_grad() ? 1 : 0);
        (x + y).sum().backward();
      }
      out.grads(fmt("find_unused=%d static_graph=%d", find_unused, static_graph), *model);
    }
  }
}

struct UnusedParamTwoLinLayerNetImpl : nn::Module {
  UnusedParamTwoLinLayerNetImpl() {
    a = register_module("a", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    b = register_module("b", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    c = register_module("c", nn::Linear(nn::LinearOptions(5, 5).bias(false)));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) { return {a(x), b(x)}; }
  nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(UnusedParamTwoLinLayerNet);

// The test's {"predictions": (a, b), "loss": loss}, as a struct of our own.
struct DictOutput {
  std::tuple<torch::Tensor, torch::Tensor> predictions;
  torch::Tensor loss;
};

auto ddp_fields(const DictOutput& o) { return std::tie(o.predictions, o.loss); }

struct DictOutputModuleImpl : nn::Module {
  DictOutputModuleImpl() : module(register_module("module", UnusedParamTwoLinLayerNet())) {}
  DictOutput forward(torch::Tensor x) {
    auto predictions = module(x);
    auto loss = (std::get<0>(predictions) + std::get<1>(predictions)).sum();
    return {predictions, loss};
  }
  UnusedParamTwoLinLayerNet module;
};
TORCH_MODULE(DictOutputModule);

template <typename Net, typename Predictions>
void output_unused_in_loss(Out& out, std::shared_ptr<ProcessGroup> pg, bool view, Predictions predictions_of) {
  Net module;
  DistributedDataParallel net(init(module), pg, DDPOptions().find_unused_parameters(true));
  const auto inp = data({10, 10}, pg->rank());
  auto [a0, b0] = predictions_of(net(inp));
  b0.sum().backward();
  out.grads(fmt("view=%d first", view), *module);
  module->zero_grad();
  for (int i = 0; i < 6; ++i) {
    auto [a_dist, b_dist] = predictions_of(net(inp));
    (i < 2 ? torch::matmul(a_dist, b_dist).sum() : b_dist.sum()).backward();
    out.grads(fmt("view=%d iteration %d", view, i), *module);
  }
  pg->barrier();
}

void test_output_unused_in_loss_tuple_module(Out& out, std::shared_ptr<ProcessGroup> pg) {
  for (bool view : {true, false})
    output_unused_in_loss<UnusedParamTwoLinLayerNet>(out, pg, view, [](auto o) { return o; });
}

void test_output_unused_in_loss_dict_module(Out& out, std::shared_ptr<ProcessGroup> pg) {
  for (bool view : {true, false})
    output_unused_in_loss<DictOutputModule>(out, pg, view, [](const DictOutput& o) { return o.predictions; });
}

struct TwoLinLayerNetImpl : nn::Module {
  TwoLinLayerNetImpl() {
    a = register_module("a", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    b = register_module("b", nn::Linear(nn::LinearOptions(10, 1).bias(false)));
  }
  nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLinLayerNet);

struct NestedSubModuleImpl : nn::Module {
  NestedSubModuleImpl() {
    embedding_net = register_module("embedding_net", EmbeddingNetDifferentParams(0));
    lin = register_module("lin", TwoLinLayerNet());
    bn = register_module("bn", BatchNormNet());
    lin_layer = register_module("lin_layer", nn::Linear(nn::LinearOptions(4, 10).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return lin->a(lin_layer(bn(x))); }
  EmbeddingNetDifferentParams embedding_net{nullptr};
  TwoLinLayerNet lin{nullptr};
  BatchNormNet bn{nullptr};
  nn::Linear lin_layer{nullptr};
};
TORCH_MODULE(NestedSubModule);

struct NestedModelImpl : nn::Module {
  NestedModelImpl() : sub_module(register_module("sub_module", NestedSubModule())) {}
  torch::Tensor forward(torch::Tensor x) { return sub_module(x); }
  NestedSubModule sub_module;
};
TORCH_MODULE(NestedModel);

void ddp_multiple_nested_unused_params_error(Out& out, std::shared_ptr<ProcessGroup> pg, bool ignore_sparse) {
  NestedModel model;
  init(model);
  auto options = DDPOptions();
  if (ignore_sparse) options.params_and_buffers_to_ignore({"sub_module.embedding_net.embedding.weight"});
  DistributedDataParallel net(model, pg, options);
  const auto inp = torch::ones({10, 2});
  net(inp).sum().backward();
  const auto message = raised(out, "iteration 1", [&] { net(inp).sum().backward(); });
  std::vector<std::string> unused = {"'sub_module.embedding_net.lin.weight'", "'sub_module.embedding_net.lin.bias'",
                                     "'sub_module.lin.b.weight'"};
  if (!ignore_sparse) unused.push_back("'sub_module.embedding_net.embedding.weight'");
  expect_names(message, unused);
  for (const char* used : {"lin_layer.weight", "lin.a.weight", "bn.fc1.weight", "bn.bn.weight"})
    EXPECT_OR_FAIL(message.find(used) == std::string::npos, std::string("a used parameter named: ") + used);
  if (ignore_sparse)
    EXPECT_OR_FAIL(message.find("embedding.weight") == std::string::npos, "the ignored parameter named: " + message);
}

void test_ddp_multiple_nested_unused_params_error(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_multiple_nested_unused_params_error(out, pg, false);
}

void test_ddp_multiple_nested_unused_params_err_ignore_params(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_multiple_nested_unused_params_error(out, pg, true);
}

struct SimpleConditionalModelImpl : nn::Module {
  explicit SimpleConditionalModelImpl(int rank) : rank(rank) {
    for (const char* name : {"nn1", "nn2", "nn3", "nn4"}) layers.push_back(register_module(name, nn::Linear(1, 1)));
  }
  torch::Tensor forward(torch::Tensor x) {
    const bool first = state == 0;
    state = first ? 1 : 0;
    return layers[(rank == 0 ? 0 : 2) + (first ? 0 : 1)](x);
  }
  int rank, state = 0;
  std::vector<nn::Linear> layers;
};
TORCH_MODULE(SimpleConditionalModel);

void test_grads_same_across_ranks_with_no_sync(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  SimpleConditionalModel net(rank);
  DistributedDataParallel model(init(net), pg, DDPOptions().find_unused_parameters(true));
  const int grad_accumulation = 2;
  for (int microbatch_idx = 0; microbatch_idx < grad_accumulation; ++microbatch_idx) {
    const auto x = data({1}, 20 + 2 * microbatch_idx + rank), y = data({1}, 21 + 2 * microbatch_idx + rank);
    if (microbatch_idx < grad_accumulation - 1) {
      auto no_sync = model.no_sync();
      torch::mse_loss(model.forward(x), y).backward();
    } else {
      torch::mse_loss(model.forward(x), y).backward();
    }
  }
  out.grads("after the accumulation", *net);
}

// torch._C._functions.UndefinedGrad: the identity, whose backward gives no
// gradient.
struct UndefinedGrad : torch::autograd::Function<UndefinedGrad> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    return {torch::Tensor()};
  }
};

void test_undefined_grad_parity_unused_parameters(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const auto x = torch::ones({1, 2});
  TestNet module;
  DistributedDataParallel net(init(module), pg, DDPOptions().find_unused_parameters(true));
  UndefinedGrad::apply(net(x).sum()).backward();
  out.grads("after the backward", *module);
}

Cases unused_parameter_cases() {
  return {
      {"test_ddp_ignore_params_arg", test_ddp_ignore_params_arg},
      {"test_ddp_unused_params_rebuild_buckets_exception", test_ddp_unused_params_rebuild_buckets_exception},
      {"test_ddp_shared_grad_acc_unused_params", test_ddp_shared_grad_acc_unused_params},
      {"test_ddp_control_flow_different_across_ranks", test_ddp_control_flow_different_across_ranks},
      {"test_ddp_control_flow_same_across_ranks", test_ddp_control_flow_same_across_ranks},
      {"test_ddp_returns_tensor_with_no_grad", test_ddp_returns_tensor_with_no_grad},
      {"test_output_unused_in_loss_tuple_module", test_output_unused_in_loss_tuple_module},
      {"test_output_unused_in_loss_dict_module", test_output_unused_in_loss_dict_module},
      {"test_ddp_multiple_nested_unused_params_error", test_ddp_multiple_nested_unused_params_error},
      {"test_ddp_multiple_nested_unused_params_err_ignore_params", test_ddp_multiple_nested_unused_params_err_ignore_params},
      {"test_grads_same_across_ranks_with_no_sync", test_grads_same_across_ranks_with_no_sync},
      {"test_undefined_grad_parity_unused_parameters", test_undefined_grad_parity_unused_parameters},
  };
}

}  // namespace ddp::testing::ported
