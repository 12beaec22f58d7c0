// PyTorch's own DDP tests (distributed_test.py), ported to libddp line by
// line: the C++ side of pytorch_ddp_tests.py, which runs each case with
// PyTorch's DDP. Each case is named after the test it ports and writes the
// same lines as the script (parameters, gradients, outputs and buffers bit for
// bit; whether an error came) to <dir>/cpp_r<rank>.txt; pytorch_parity_test.cpp
// compares the two. Where PyTorch's test checks an error's words, the port
// checks that ours names the same cause.
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "../support/worker_common.h"
#include "ddp/comm/dist.h"

namespace ddp::testing {
namespace ported {  // named: the rank program is a unity build, and these names are common

namespace nn = torch::nn;

// pytorch_ddp_tests.py's Out: one line per observation, "<case> <label> ...".
struct Out {
  std::string case_name;
  std::vector<std::string> lines;

  void tensor(const std::string& label, const torch::Tensor& t) {
    const auto c = t.detach().contiguous();
    static const std::map<at::ScalarType, std::string> names = {
        {at::kFloat, "f32"}, {at::kDouble, "f64"}, {at::kLong, "i64"}, {at::kInt, "i32"}};
    std::ostringstream s;
    s << case_name << " " << label << " " << names.at(c.scalar_type()) << " ";
    if (c.dim() == 0) s << "scalar";
    for (int64_t d = 0; d < c.dim(); ++d) s << (d ? "x" : "") << c.size(d);
    s << " :";
    const auto values = c.is_floating_point() ? c.to(at::kDouble).reshape({-1}).view(at::kLong) : c.to(at::kLong).reshape({-1});
    const auto* v = values.data_ptr<int64_t>();
    for (int64_t i = 0; i < values.numel(); ++i) s << " " << v[i];
    lines.push_back(s.str());
  }
  void text(const std::string& label, const std::string& value) { lines.push_back(case_name + " " + label + " " + value); }
  void text(const std::string& label, int64_t value) { text(label, std::to_string(value)); }
  void grads(const std::string& label, const nn::Module& m) {
    for (const auto& [name, p] : unique_parameters(m)) {
      if (p.grad().defined()) tensor(label + " " + name + ".grad", p.grad());
      else text(label + " " + name + ".grad", "none");
    }
  }
  void params(const std::string& label, const nn::Module& m) {
    for (const auto& [name, p] : unique_parameters(m)) tensor(label + " " + name, p);
  }
};

// The script's init(): floating-point parameter i, element k: 0.3 sin(0.7 k + i + shift).
template <typename M>
M& init(M& module, double shift = 0.0) {
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& [name, p] : unique_parameters(*module)) {
    if (p.is_floating_point()) {
      auto k = torch::arange(p.numel(), torch::kDouble);
      p.copy_((torch::sin(0.7 * k + i + shift) * 0.3).reshape(p.sizes()));
    }
    ++i;
  }
  return module;
}

// The script's data(): cos(0.37 k + seed), rounded to float once.
torch::Tensor data(std::vector<int64_t> shape, double seed) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return torch::cos(0.37 * torch::arange(n, torch::kDouble) + seed).reshape(shape).to(torch::kFloat);
}

std::string fmt(const char* format, int a, int b = 0, int c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b, c);
  return buf;
}

// The script's raised(): whether fn threw; the message when it did.
std::string raised(Out& out, const std::string& label, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {  // ours are c10::Errors too (ddp/errors.h)
    out.text(label, "raised");
    return e.what();
  }
  out.text(label, "returned");
  return "";
}

void expect_names(const std::string& message, const std::vector<std::string>& words) {
  for (const auto& w : words) EXPECT_OR_FAIL(message.find(w) != std::string::npos, "'" + w + "' in: " + message);
}

// ---- the cases, in distributed_test.py's order ------------------------------

struct FC2Impl : nn::Module {
  FC2Impl() : fc(register_module("fc", nn::Linear(10, 50))) { fc->bias.set_requires_grad(false); }
  torch::Tensor forward(torch::Tensor x) { return fc(x); }
  nn::Linear fc;
};
TORCH_MODULE(FC2);

struct TestNetImpl : nn::Module {
  TestNetImpl() {
    no_grad_param = register_parameter("no_grad_param", torch::tensor({2, 2}, torch::kLong), false);
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(2, 10).bias(false)));
    fc2 = register_module("fc2", FC2());
    fc3 = register_module("fc3", nn::Linear(nn::LinearOptions(50, 4).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    return torch::softmax(fc3(x), 1);
  }
  torch::Tensor no_grad_param;
  nn::Linear fc1{nullptr}, fc3{nullptr};
  FC2 fc2{nullptr};
};
TORCH_MODULE(TestNet);

void step_with_zero_grad(nn::Module& m) {
  for (auto& p : m.parameters()) {
    if (!p.grad().defined()) continue;
    {
      torch::NoGradGuard no_grad;
      p += p.grad();
    }
    p.mutable_grad().requires_grad_(false);
    p.mutable_grad().zero_();
  }
}

void step(nn::Module& m) {
  for (auto& p : m.parameters()) {
    if (!p.grad().defined()) continue;
    {
      torch::NoGradGuard no_grad;
      p += p.grad();
    }
    p.mutable_grad() = torch::Tensor();
  }
}

void distributed_data_parallel_cpu(Out& out, std::shared_ptr<ProcessGroup> pg, bool as_view) {
  const int rank = pg->rank(), world = pg->size();
  TestNet net;
  DistributedDataParallel model(init(net), pg, DDPOptions().gradient_as_bucket_view(as_view));
  const int local_bs = 2, global_bs = world * local_bs;
  auto inp = data({global_bs, 2}, 1), target = data({global_bs, 4}, 2);
  torch::manual_seed(5);
  for (int it = 0; it < 5; ++it) {
    const int off = rank * local_bs;
    auto output = model(inp.slice(0, off, off + local_bs));
    torch::mse_loss(output, target.slice(0, off, off + local_bs)).backward();
    step_with_zero_grad(*net);
    out.params(fmt("iteration %d", it), *net);
    inp = inp.index({torch::randperm(global_bs)});
  }
}

void test_DistributedDataParallelCPU(Out& out, std::shared_ptr<ProcessGroup> pg) {
  distributed_data_parallel_cpu(out, pg, false);
}

void test_DistributedDataParallelCPU_grad_is_view(Out& out, std::shared_ptr<ProcessGroup> pg) {
  distributed_data_parallel_cpu(out, pg, true);
}

void test_DistributedDataParallel_requires_grad(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const auto message = raised(out, "DDP(nn.Module())", [&] {
    DistributedDataParallel model(std::make_shared<nn::Module>(), pg);
  });
  expect_names(message, {"rank " + std::to_string(pg->rank()), "no parameter that requires a gradient"});
  pg->barrier();
}

struct ScalarModelImpl : nn::Module {
  explicit ScalarModelImpl(int rank) : p(register_parameter("p", torch::tensor(1.0f + rank))) {}
  torch::Tensor forward() { return p.pow(2); }
  torch::Tensor p;
};
TORCH_MODULE(ScalarModel);

void test_ddp_create_graph(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ScalarModel model(pg->rank());
  DistributedDataParallel ddp_model(model, pg);
  for (int it = 0; it < 6; ++it) {
    ddp_model().backward({}, c10::nullopt, /*create_graph=*/true);
    out.tensor(fmt("iteration %d p.grad", it), model->p.grad());
    bool all = true;
    for (const auto& p : model->parameters()) all = all && p.requires_grad();
    out.text(fmt("iteration %d requires_grad", it), all ? 1 : 0);
  }
}

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

void test_ddp_inference(Out& out, std::shared_ptr<ProcessGroup> pg) {
  TestNet net, local;
  init(net);
  init(local);
  DistributedDataParallel model(net, pg);
  const auto inp = data({10, 2}, 1);
  if (pg->rank() == 0) {
    net->eval();
    local->eval();
    torch::Tensor a;
    for (int i = 0; i < 6; ++i) {
      a = model(inp);
      out.text("equal to the local model", torch::equal(a, local(inp)) ? 1 : 0);
    }
    out.tensor("output", a);
  }
  pg->barrier();
}

struct BatchNormNetImpl : nn::Module {
  BatchNormNetImpl() {
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(2, 40).bias(false)));
    bn = register_module("bn", nn::BatchNorm1d(4));
    fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(40, 4).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = bn(torch::reshape(fc1(x), {-1, 4, 10}));
    return torch::softmax(fc2(torch::reshape(x, {-1, 40})), 1);
  }
  nn::Linear fc1{nullptr}, fc2{nullptr};
  nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BatchNormNet);

void ddp_evaluation_after_training(Out& out, std::shared_ptr<ProcessGroup> pg) {
  BatchNormNet net;
  DistributedDataParallel model(init(net), pg);
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int it = 0; it < 3; ++it) {
    opt.zero_grad();
    model(data({4, 2}, 10 * it + pg->rank())).sum().backward();
    opt.step();
  }
  net->eval();
  torch::NoGradGuard no_grad;
  for (int it = 0; it < 2; ++it) out.tensor(fmt("evaluation %d output", it), model(data({4, 2}, 7)));
  out.tensor("running_mean", net->bn->running_mean);
  out.tensor("running_var", net->bn->running_var);
}

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

struct NetWithBufferImpl : nn::Module {
  explicit NetWithBufferImpl(int rank) {
    a = register_module("a", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    b = register_module("b", nn::Linear(nn::LinearOptions(10, 1).bias(false)));
    buffer = register_buffer("buffer", data({1, 2}, rank));
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)); }
  nn::Linear a{nullptr}, b{nullptr};
  torch::Tensor buffer;
};
TORCH_MODULE(NetWithBuffer);

void test_ddp_broadcast_buffer(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  NetWithBuffer net(rank);
  DistributedDataParallel model_ddp(init(net, rank), pg);
  const auto inp = data({2, 10}, 5 + rank);
  for (int i = 0; i < 2; ++i) {
    if (rank == 0) {
      torch::NoGradGuard no_grad;
      net->buffer.add_(1);  // the test reassigns module.buffer; in C++ the registered tensor changes in place
    }
    model_ddp(inp).sum().backward();
    out.tensor(fmt("iteration %d buffer", i), net->buffer);
  }
}

// The script's outcome(): one iteration, and where it threw.
void outcome(Out& out, const std::string& label, const std::function<torch::Tensor()>& forward) {
  torch::Tensor result;
  try {
    result = forward();
  } catch (const c10::Error&) {
    out.text(label, "forward raised");
    return;
  }
  try {
    result.sum().backward();
  } catch (const c10::Error&) {
    out.text(label, "backward raised");
    return;
  }
  out.text(label, "returned");
}

// _test_accumulate_gradients_no_sync (2.11's) on _prepare_cpu_module's
// module: TestNet, buckets of 0.001 MiB.
void accumulate_gradients_no_sync(Out& out, std::shared_ptr<ProcessGroup> pg, int num_iters,
                                  const std::function<void(DistributedDataParallelBase&)>& register_hook,
                                  bool as_view) {
  const int rank = pg->rank(), world = pg->size();
  TestNet net;
  DistributedDataParallel ddp_model(init(net), pg, DDPOptions().bucket_cap_mb(0.001).gradient_as_bucket_view(as_view));
  auto inp = data({world, 2}, 3), target = data({world, 4}, 4);
  if (register_hook) register_hook(ddp_model);
  auto step_model = [&](const torch::Tensor& x, const torch::Tensor& y) {
    net->train();
    torch::mse_loss(ddp_model(x), y).backward();
  };
  {
    torch::NoGradGuard no_grad;
    auto no_sync = ddp_model.no_sync();
    net->train();
    ddp_model(inp);
  }
  for (int iteration = 0; iteration < num_iters; ++iteration) {
    const auto x = inp.slice(0, rank, rank + 1), y = target.slice(0, rank, rank + 1);
    if (iteration % 2 == 0) {
      auto no_sync = ddp_model.no_sync();
      step_model(x, y);
    } else {
      step_model(x, y);
    }
    out.grads(fmt("iteration %d", iteration), *net);
    torch::manual_seed(1337 + iteration);
    inp = inp.index({torch::randperm(world)});
  }
}

void test_accumulate_gradients_no_sync(Out& out, std::shared_ptr<ProcessGroup> pg) {
  accumulate_gradients_no_sync(out, pg, 2, nullptr, false);
}

void test_accumulate_gradients_no_sync_grad_is_view(Out& out, std::shared_ptr<ProcessGroup> pg) {
  accumulate_gradients_no_sync(out, pg, 2, nullptr, true);
}

void test_accumulate_gradients_no_sync_allreduce_hook(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int world = pg->size();
  accumulate_gradients_no_sync(out, pg, 4, [&](DistributedDataParallelBase& model) {
    model.register_comm_hook(pg, [world](std::shared_ptr<ProcessGroup>& group, GradBucket& bucket) {
      auto tensor = bucket.buffer() / world;
      return CommFuture(group->allreduce(tensor), tensor);
    });
  }, false);
}

void test_accumulate_gradients_no_sync_allreduce_with_then_hook(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int world = pg->size();
  accumulate_gradients_no_sync(out, pg, 4, [&](DistributedDataParallelBase& model) {
    model.register_comm_hook(pg, [world](std::shared_ptr<ProcessGroup>& group, GradBucket& bucket) {
      auto buffer = bucket.buffer();
      return CommFuture(group->allreduce(buffer), buffer)
          .then([](const torch::Tensor& t) { return 2 * t; })
          .then([world](const torch::Tensor& t) { return t / (2 * world); });
    });
  }, false);
}

struct ZeroOutputModelImpl : nn::Module {
  ZeroOutputModelImpl() {
    register_module("net1", nn::Linear(10, 10));
    register_module("relu", nn::ReLU());
    register_module("net2", nn::Linear(10, 0));
  }
};
TORCH_MODULE(ZeroOutputModel);

void test_ddp_zero_output_features(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ZeroOutputModel model;
  init(model);
  raised(out, "DDP(model)", [&] { DistributedDataParallel ddp(model, pg); });
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

struct ControlFlowToyModelImpl : nn::Module {
  ControlFlowToyModelImpl() {
    lin1 = register_module("lin1", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
    lin2 = register_module("lin2", nn::Linear(nn::LinearOptions(10, 10).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (torch::equal(x, torch::ones({20, 10}))) return lin2(torch::relu(lin1(x)));
    return torch::relu(lin1(x));
  }
  nn::Linear lin1{nullptr}, lin2{nullptr};
};
TORCH_MODULE(ControlFlowToyModel);

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

void test_ddp_sync_module_states(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  nn::Linear model(nn::LinearOptions(2, 2).bias(false));
  init(model, rank);
  DistributedDataParallel net(model, pg, DDPOptions().bucket_cap_mb(1));
  nn::Linear new_model(nn::LinearOptions(2, 2).bias(false));
  init(new_model, 10 + rank);
  {
    torch::NoGradGuard no_grad;
    model->weight.copy_(new_model->weight);  // the test's net.module = deepcopy(new_model)
  }
  broadcast_coalesced(*pg, {model->weight}, 1);  // _sync_module_states(..., src=1)
  out.params("after the broadcast from rank 1", *model);
}

void test_ddp_grad_div_uneven_inputs(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), dim = 5;
  const auto inp = torch::ones({1, dim}) * 50;
  nn::Linear model(nn::LinearOptions(dim, dim).bias(false));
  DistributedDataParallel net(init(model), pg, DDPOptions().bucket_cap_mb(1));
  const int n_iters = 3 + (rank > 0 ? 2 : 0);
  for (int divide : {0, 1}) {
    Join join({&net}, JoinOptions().divide_by_initial_world_size(divide));
    for (int i = 0; i < n_iters; ++i) {
      net(inp).sum().backward();
      out.tensor(fmt("divide_by_initial_world_size=%d iteration %d grad", divide, i), model->weight.grad());
      model->zero_grad();
    }
  }
}

void test_ddp_join_model_equivalence(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  nn::Linear model(nn::LinearOptions(10, 10).bias(false));
  init(model);
  const auto inp = data({3, 10}, rank);
  const int num_iters = 2 * (rank + 1);
  DistributedDataParallel net(model, pg);
  torch::optim::SGD ddp_optim(model->parameters(), 0.03 * world);
  join({&net}, [&] {
    for (int i = 0; i < num_iters; ++i) {
      ddp_optim.zero_grad();
      net(inp).sum().backward();
      ddp_optim.step();
    }
  });
  out.params("after Join", *model);
}

void test_ddp_uneven_input_join_disable(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  nn::Linear model(1, 1);
  DistributedDataParallel net(init(model, rank), pg);
  const auto inp = torch::ones({1}) * rank;
  {
    Join join({&net}, JoinOptions().enable(false));
    for (int i = 0; i < 5; ++i) {
      auto& grad = model->weight.mutable_grad();
      if (grad.defined()) {
        grad.requires_grad_(false);
        grad.zero_();
      }
      net(inp).sum().backward();
      out.tensor(fmt("iteration %d weight.grad", i), model->weight.grad());
    }
  }
  out.text("join enabled", net.join_config().enable ? 1 : 0);
}

struct ExceptionModuleImpl : nn::Module {
  ExceptionModuleImpl() { register_parameter("param", torch::ones({1})); }
  torch::Tensor forward(torch::Tensor) { throw std::invalid_argument("Intentional error"); }
};
TORCH_MODULE(ExceptionModule);

void test_ddp_uneven_input_exception(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ExceptionModule module;
  DistributedDataParallel net(module, pg);
  try {
    join({&net}, [&] { net(torch::ones({1})).sum().backward(); });
    out.text("the forward's own error through Join", "returned");
  } catch (const std::invalid_argument& e) {
    EXPECT_OR_FAIL(std::string(e.what()) == "Intentional error", e.what());
    out.text("the forward's own error through Join", "raised");
  }
}

struct EmbeddingNetDifferentParamsImpl : nn::Module {
  EmbeddingNetDifferentParamsImpl(int rank, bool diff_num_params = false) {
    const int64_t dim = diff_num_params || rank == 0 ? 500 : 50;
    embedding = register_module("embedding", nn::Embedding(10, dim));
    lin = register_module("lin", nn::Linear(dim, 1));
    if (diff_num_params) register_module("lin2", nn::Linear(nn::LinearOptions(1, 1).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return lin(embedding(x)); }
  nn::Embedding embedding{nullptr};
  nn::Linear lin{nullptr};
};
TORCH_MODULE(EmbeddingNetDifferentParams);

// _run_test_ddp_model_with_diff_params: at least one rank raises (here every
// rank does, naming the difference).
void ddp_model_with_diff_params(Out& out, std::shared_ptr<ProcessGroup> pg, EmbeddingNetDifferentParams net) {
  const auto group_gloo = dist::new_group({}, std::chrono::seconds(60), "gloo");
  const auto group_to_use = dist::new_group({}, std::chrono::seconds(10), dist::get_backend());
  const auto message = [&] {
    try {
      DistributedDataParallel ddp(net, group_to_use.process_group());
    } catch (const c10::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  expect_names(message, {"rank " + std::to_string(pg->rank()), "not the same on every rank"});
  auto t = torch::tensor({message.empty() ? 0.0f : 1.0f});
  dist::all_reduce(t, dist::ReduceOp::SUM, group_gloo);
  out.text("some rank raised", t.item<float>() > 0 ? 1 : 0);
}

void test_ddp_model_diff_shape_across_ranks(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_model_with_diff_params(out, pg, EmbeddingNetDifferentParams(pg->rank()));
}

void test_ddp_model_diff_num_params_across_ranks(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_model_with_diff_params(out, pg, EmbeddingNetDifferentParams(pg->rank(), pg->rank() == 1));
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

using Case = void (*)(Out&, std::shared_ptr<ProcessGroup>);
const std::vector<std::pair<std::string, Case>> kCases = {
    {"test_DistributedDataParallelCPU", test_DistributedDataParallelCPU},
    {"test_DistributedDataParallelCPU_grad_is_view", test_DistributedDataParallelCPU_grad_is_view},
    {"test_DistributedDataParallel_requires_grad", test_DistributedDataParallel_requires_grad},
    {"test_ddp_create_graph", test_ddp_create_graph},
    {"test_ddp_ignore_params_arg", test_ddp_ignore_params_arg},
    {"test_ddp_unused_params_rebuild_buckets_exception", test_ddp_unused_params_rebuild_buckets_exception},
    {"test_ddp_shared_grad_acc_unused_params", test_ddp_shared_grad_acc_unused_params},
    {"test_ddp_control_flow_different_across_ranks", test_ddp_control_flow_different_across_ranks},
    {"test_ddp_inference", test_ddp_inference},
    {"ddp_evaluation_after_training", ddp_evaluation_after_training},
    {"test_ddp_static_graph_nested_types", test_ddp_static_graph_nested_types},
    {"test_ddp_returns_tensor_with_no_grad", test_ddp_returns_tensor_with_no_grad},
    {"test_ddp_new_tensor_in_fwd", test_ddp_new_tensor_in_fwd},
    {"test_ddp_new_tensor_in_fwd_static_graph", test_ddp_new_tensor_in_fwd_static_graph},
    {"test_ddp_broadcast_buffer", test_ddp_broadcast_buffer},
    {"test_accumulate_gradients_no_sync", test_accumulate_gradients_no_sync},
    {"test_accumulate_gradients_no_sync_grad_is_view", test_accumulate_gradients_no_sync_grad_is_view},
    {"test_accumulate_gradients_no_sync_allreduce_hook", test_accumulate_gradients_no_sync_allreduce_hook},
    {"test_accumulate_gradients_no_sync_allreduce_with_then_hook",
     test_accumulate_gradients_no_sync_allreduce_with_then_hook},
    {"test_ddp_zero_output_features", test_ddp_zero_output_features},
    {"test_grads_same_across_ranks_with_no_sync", test_grads_same_across_ranks_with_no_sync},
    {"test_invalid_static_graph", test_invalid_static_graph},
    {"test_output_unused_in_loss_tuple_module", test_output_unused_in_loss_tuple_module},
    {"test_output_unused_in_loss_dict_module", test_output_unused_in_loss_dict_module},
    {"test_ddp_sync_module_states", test_ddp_sync_module_states},
    {"test_ddp_grad_div_uneven_inputs", test_ddp_grad_div_uneven_inputs},
    {"test_ddp_join_model_equivalence", test_ddp_join_model_equivalence},
    {"test_ddp_uneven_input_join_disable", test_ddp_uneven_input_join_disable},
    {"test_ddp_uneven_input_exception", test_ddp_uneven_input_exception},
    {"test_ddp_model_diff_shape_across_ranks", test_ddp_model_diff_shape_across_ranks},
    {"test_ddp_model_diff_num_params_across_ranks", test_ddp_model_diff_num_params_across_ranks},
    {"test_ddp_multiple_nested_unused_params_error", test_ddp_multiple_nested_unused_params_error},
    {"test_ddp_multiple_nested_unused_params_err_ignore_params", test_ddp_multiple_nested_unused_params_err_ignore_params},
    {"test_ddp_control_flow_same_across_ranks", test_ddp_control_flow_same_across_ranks},
};

}  // namespace ported

// --cases a,b (default: every case): runs them in order, each followed by a
// barrier as the script's, and writes <DDP_TEST_DIR>/cpp_r<rank>.txt.
int scenario_pytorch_tests(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const auto wanted = split_commas(flags.count("--cases") ? flags["--cases"] : "");
  ported::Out out;
  for (const auto& [name, run] : ported::kCases) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
    out.case_name = name;
    run(out, pg);
    pg->barrier();
  }
  std::ofstream f(std::string(std::getenv("DDP_TEST_DIR")) + "/cpp_r" + std::to_string(pg->rank()) + ".txt");
  for (const auto& l : out.lines) f << l << "\n";
  return f.good() ? 0 : 1;
}

}  // namespace ddp::testing
