// What the ports of PyTorch's own DDP tests share (training.cpp,
// unused_parameters.cpp, outputs_and_static_graph.cpp, join.cpp,
// post_local_sgd.cpp of distributed_test.py's, c10d_gloo.cpp of
// test_c10d_gloo.py's; cases.cpp runs them): the lines a case writes, as
// pytorch_ddp_tests.py's Out, the script's helpers (init, data, raised,
// outcome), the models several tests of distributed_test.py use and the
// hook parity run several of them share. Change both sides together: the test compares
// their lines.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../../support/worker_common.h"

namespace ddp::testing::ported {  // named: the rank program is a unity build

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
inline torch::Tensor data(std::vector<int64_t> shape, double seed) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return torch::cos(0.37 * torch::arange(n, torch::kDouble) + seed).reshape(shape).to(torch::kFloat);
}

inline std::string fmt(const char* format, int a, int b = 0, int c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b, c);
  return buf;
}

// The script's raised(): whether fn threw; the message when it did.
inline std::string raised(Out& out, const std::string& label, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {  // ours are c10::Errors too (ddp/errors.h)
    out.text(label, "raised");
    return e.what();
  }
  out.text(label, "returned");
  return "";
}

inline void expect_names(const std::string& message, const std::vector<std::string>& words) {
  for (const auto& w : words) EXPECT_OR_FAIL(message.find(w) != std::string::npos, "'" + w + "' in: " + message);
}

inline void step_with_zero_grad(nn::Module& m) {
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

inline void step(nn::Module& m) {
  for (auto& p : m.parameters()) {
    if (!p.grad().defined()) continue;
    {
      torch::NoGradGuard no_grad;
      p += p.grad();
    }
    p.mutable_grad() = torch::Tensor();
  }
}

// The script's outcome(): one iteration, and where it threw.
inline void outcome(Out& out, const std::string& label, const std::function<torch::Tensor()>& forward) {
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

// ---- models several tests use ----------------------------------------------

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

// The tests' Task: p + x, p a 2x2 parameter of ones.
struct TaskImpl : nn::Module {
  TaskImpl() : p(register_parameter("p", torch::ones({2, 2}))) {}
  torch::Tensor forward(torch::Tensor x) { return p + x; }
  torch::Tensor p;
};
TORCH_MODULE(Task);

// A parameter's or buffer's values as two float64 sums (plain, and weighted
// by position), as the script's checksums(): bitwise the same for the same
// values, two numbers for any size.
inline void checksums(Out& out, const std::string& label, const nn::Module& module) {
  auto write = [&](const std::string& name, const torch::Tensor& t) {
    const auto flat = t.detach().to(torch::kDouble).reshape({-1});
    out.tensor(label + " " + name, torch::stack({flat.sum(), (flat * torch::arange(flat.numel())).sum()}));
  };
  for (const auto& [name, p] : unique_parameters(module)) write(name, p);
  for (const auto& b : module.named_buffers()) write(b.key(), b.value());
}

// checksums() of every gradient; "none" for a missing one (the script's grad_checksums()).
inline void grad_checksums(Out& out, const std::string& label, const nn::Module& module) {
  for (const auto& [name, p] : unique_parameters(module)) {
    if (!p.grad().defined()) {
      out.text(label + " " + name + ".grad", "none");
      continue;
    }
    const auto flat = p.grad().to(torch::kDouble).reshape({-1});
    out.tensor(label + " " + name + ".grad", torch::stack({flat.sum(), (flat * torch::arange(flat.numel())).sum()}));
  }
}

// ---- what several tests run ---------------------------------------------------

// _test_ddp_hook_parity: Linear(1, 5) with and without the hook, 100
// iterations; the weight's gradients are cleared by hand, the bias's
// accumulate.
template <typename State, typename Hook>
void ddp_hook_parity(Out& out, std::shared_ptr<ProcessGroup> pg, State state, Hook hook,
                     std::shared_ptr<ProcessGroup> process_group, const std::string& label = "") {
  const int rank = pg->rank();
  nn::Linear with(1, 5), without(1, 5);
  init(with);
  init(without);
  auto group = process_group ? process_group : pg;
  DistributedDataParallel net_with_hook(with, group);
  net_with_hook.register_comm_hook(std::move(state), hook);
  DistributedDataParallel net_without_hook(without, group);
  for (int i = 0; i < 100; ++i) {
    for (auto* m : {&without, &with}) {
      auto& g = (*m)->weight.mutable_grad();
      if (g.defined()) {
        g.requires_grad_(false);
        g.zero_();
      }
    }
    const auto batch = torch::tensor({static_cast<float>(rank)});
    net_without_hook(batch).sum().backward();
    net_with_hook(batch).sum().backward();
    if (i < 3 || i % 25 == 24) {
      out.grads(label + fmt("iteration %d without the hook", i), *without);
      out.grads(label + fmt("iteration %d with the hook", i), *with);
    }
  }
}

using Case = void (*)(Out&, std::shared_ptr<ProcessGroup>);
using Cases = std::vector<std::pair<std::string, Case>>;
Cases training_cases();
Cases unused_parameter_cases();
Cases output_and_static_graph_cases();
Cases join_cases();
Cases c10d_gloo_cases();  // test_c10d_gloo.py's
Cases post_local_sgd_cases();

}  // namespace ddp::testing::ported
