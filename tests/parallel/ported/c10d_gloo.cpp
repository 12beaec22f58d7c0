// Ported tests of test/distributed/test_c10d_gloo.py's DistributedDataParallelTest
// (their CPU halves), named "test_c10d_gloo.<test>": what DDP leaves of a
// parameter no rank used, outputs that are dropped without a backward, a
// hook whose future is made by the hook itself, a second hook. And of
// test_c10d_common.py's ("test_c10d_common.<test>"): PowerSGD's refused
// states, the bucket assignment.
#include "ported_case.h"

#include "parallel/reducer/bucket_assignment.h"

namespace ddp::testing::ported {

// The tests' Task: p + x, p a 2x2 parameter of ones.
struct TaskImpl : nn::Module {
  TaskImpl() : p(register_parameter("p", torch::ones({2, 2}))) {}
  torch::Tensor forward(torch::Tensor x) { return p + x; }
  torch::Tensor p;
};
TORCH_MODULE(Task);

struct GlobalLocalUnusedParamModuleImpl : nn::Module {
  GlobalLocalUnusedParamModuleImpl() {
    t0 = register_module("t0", Task());
    t1 = register_module("t1", Task());
    task_unused = register_module("task_unused", Task());
  }
  torch::Tensor forward(double x, int rank) { return rank == 0 ? t0(torch::scalar_tensor(x)) : t1(torch::scalar_tensor(x)); }
  Task t0{nullptr}, t1{nullptr}, task_unused{nullptr};
};
TORCH_MODULE(GlobalLocalUnusedParamModule);

// _test_global_local_unused_params_grad, its CPU half: the grad of a
// parameter no rank used stays undefined; one some rank used gets it.
void global_local_unused_params_grad(Out& out, std::shared_ptr<ProcessGroup> pg, DDPOptions options) {
  GlobalLocalUnusedParamModule module;
  DistributedDataParallel model(module, pg, options.find_unused_parameters(true));
  auto output = model(8.0, pg->rank());
  out.grads("before the backward", *module);
  output.mean().backward();
  out.grads("after the backward", *module);
}

void test_global_local_unused_params_grad(Out& out, std::shared_ptr<ProcessGroup> pg) {
  global_local_unused_params_grad(out, pg, DDPOptions());
}

void test_global_local_unused_params_grad_with_grad_is_view(Out& out, std::shared_ptr<ProcessGroup> pg) {
  global_local_unused_params_grad(out, pg, DDPOptions().gradient_as_bucket_view(true));
}

void test_global_local_unused_params_grad_with_static_graph(Out& out, std::shared_ptr<ProcessGroup> pg) {
  global_local_unused_params_grad(out, pg, DDPOptions().static_graph(true));
}

struct FindUnusedParamModuleImpl : nn::Module {
  FindUnusedParamModuleImpl() {
    t0 = register_module("t0", Task());
    t1 = register_module("t1", Task());
  }
  torch::Tensor forward(double x, int rank) {
    const auto input = torch::scalar_tensor(x);
    return rank == 0 ? t1(t0(input)) : t1(input);
  }
  Task t0{nullptr}, t1{nullptr};
};
TORCH_MODULE(FindUnusedParamModule);

void test_find_unused_parameters_when_unused_parameters_empty(Out& out, std::shared_ptr<ProcessGroup> pg) {
  FindUnusedParamModule module;
  DistributedDataParallel model(module, pg, DDPOptions().find_unused_parameters(true));
  model(8.0, pg->rank()).mean().backward();
  out.grads("after the backward", *module);
}

struct IgnoredOutputImpl : nn::Module {
  explicit IgnoredOutputImpl(bool unused) {
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(2, 10).bias(false)));
    fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(10, 4).bias(false)));
    if (unused) register_module("fc3", nn::Linear(nn::LinearOptions(4, 4).bias(false)));
    register_module("relu", nn::ReLU());
  }
  torch::Tensor forward(torch::Tensor x) { return torch::softmax(torch::relu(fc2(torch::relu(fc1(x)))), 1); }
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(IgnoredOutput);

// test_ignored_output(_with_unused_parameters): four forwards whose output is
// dropped, then four trained with CrossEntropyLoss.
void ignored_output(Out& out, std::shared_ptr<ProcessGroup> pg, bool unused) {
  const int rank = pg->rank();
  IgnoredOutput module(unused);
  DistributedDataParallel model(init(module), pg, DDPOptions().find_unused_parameters(unused));
  const auto inp = data({4, 2}, rank);
  std::vector<int64_t> targets;
  for (int i = 0; i < 4; ++i) targets.push_back((rank + i) % 4);
  const auto target = torch::tensor(targets, torch::kLong);
  for (int i = 0; i < 4; ++i) model(inp);
  for (int i = 0; i < 4; ++i) {
    torch::nn::functional::cross_entropy(model(inp), target).backward();
    out.grads(fmt("iteration %d", i), *module);
  }
}

void test_ignored_output(Out& out, std::shared_ptr<ProcessGroup> pg) { ignored_output(out, pg, false); }

void test_ignored_output_with_unused_parameters(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ignored_output(out, pg, true);
}

struct ModuleForDdpCommHookImpl : nn::Module {
  ModuleForDdpCommHookImpl() : t0(register_module("t0", Task())) {}
  torch::Tensor forward(double x, int rank) { return t0(torch::scalar_tensor(x + rank)); }
  Task t0;
};
TORCH_MODULE(ModuleForDdpCommHook);

// _simple_hook: a future set to ones, then one added: every gradient is 2.
void test_ddp_comm_hook_future_passing_cpu(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ModuleForDdpCommHook module;
  DistributedDataParallel cpu_model(module, pg);
  cpu_model.register_comm_hook(std::shared_ptr<ProcessGroup>(), [](std::shared_ptr<ProcessGroup>&, GradBucket& bucket) {
    return CommFuture::ready(torch::ones_like(bucket.buffer())).then([](const torch::Tensor& value) {
      return value + torch::ones_like(value);
    });
  });
  cpu_model(8.0, pg->rank()).mean().backward();
  out.grads("after the backward", *module);
}

void test_ddp_comm_hook_register_just_once(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ModuleForDdpCommHook module;
  DistributedDataParallel model(module, pg);
  auto dummy_hook = [](std::shared_ptr<ProcessGroup>&, GradBucket& bucket) { return CommFuture::ready(bucket.buffer()); };
  model.register_comm_hook(std::shared_ptr<ProcessGroup>(), dummy_hook);
  const auto message = raised(out, "the second register_comm_hook",
                              [&] { model.register_comm_hook(std::shared_ptr<ProcessGroup>(), dummy_hook); });
  expect_names(message, {"register_comm_hook", "once"});
}

// ---- test_c10d_common.py's ------------------------------------------------------

void test_invalid_powerSGD_state(Out& out, std::shared_ptr<ProcessGroup>) {
  for (int start_powerSGD_iter : {0, 1}) {
    for (int use_error_feedback : {1, 0}) {
      for (int warm_start : {1, 0}) {
        if (!use_error_feedback && !warm_start) continue;
        const auto message = raised(
            out, fmt("start_powerSGD_iter=%d use_error_feedback=%d warm_start=%d", start_powerSGD_iter,
                     use_error_feedback, warm_start),
            [&] {
              hooks::PowerSGDState(nullptr, hooks::PowerSGDOptions()
                                                .matrix_approximation_rank(1)
                                                .start_powerSGD_iter(start_powerSGD_iter)
                                                .use_error_feedback(use_error_feedback)
                                                .warm_start(warm_start));
            });
        expect_names(message, {"start_powerSGD_iter"});
      }
    }
  }
}

// ComputeBucketAssignmentTest: the buckets of our assignment for PyTorch's
// limits (the first, then the rest), parameters in their order.
void bucket_assignment(Out& out, const std::vector<torch::Tensor>& tensors, int64_t first_limit, int64_t limit) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::string text = "[";
  for (const auto& bucket : compute_bucket_assignment(tensors, order, first_limit, limit)) {
    text += text.size() > 1 ? ",[" : "[";
    for (size_t j = 0; j < bucket.size(); ++j) text += (j ? "," : "") + std::to_string(bucket[j]);
    text += "]";
  }
  out.text("buckets", text + "]");
}

std::vector<torch::Tensor> alternating_float_and_double() {
  std::vector<torch::Tensor> tensors;
  for (int i = 0; i < 3; ++i) {
    tensors.push_back(torch::empty({50}, torch::kFloat));
    tensors.push_back(torch::empty({25}, torch::kDouble));
  }
  return tensors;
}

void test_single_limit_single_dtype(Out& out, std::shared_ptr<ProcessGroup>) {
  bucket_assignment(out, {torch::empty({100}), torch::empty({200}), torch::empty({100}), torch::empty({50})}, 400, 400);
}

void test_single_limit_multi_dtype(Out& out, std::shared_ptr<ProcessGroup>) {
  bucket_assignment(out, alternating_float_and_double(), 400, 400);
}

void test_multi_limit_single_dtype(Out& out, std::shared_ptr<ProcessGroup>) {
  bucket_assignment(out, {torch::empty({10}), torch::empty({10}), torch::empty({10}), torch::empty({10})}, 40, 80);
}

void test_multi_limit_multi_dtype(Out& out, std::shared_ptr<ProcessGroup>) {
  bucket_assignment(out, alternating_float_and_double(), 200, 400);
}

Cases c10d_gloo_cases() {
  return {
      {"test_c10d_gloo.test_global_local_unused_params_grad", test_global_local_unused_params_grad},
      {"test_c10d_gloo.test_global_local_unused_params_grad_with_grad_is_view",
       test_global_local_unused_params_grad_with_grad_is_view},
      {"test_c10d_gloo.test_global_local_unused_params_grad_with_static_graph",
       test_global_local_unused_params_grad_with_static_graph},
      {"test_c10d_gloo.test_find_unused_parameters_when_unused_parameters_empty",
       test_find_unused_parameters_when_unused_parameters_empty},
      {"test_c10d_gloo.test_ignored_output", test_ignored_output},
      {"test_c10d_gloo.test_ignored_output_with_unused_parameters", test_ignored_output_with_unused_parameters},
      {"test_c10d_gloo.test_ddp_comm_hook_future_passing_cpu", test_ddp_comm_hook_future_passing_cpu},
      {"test_c10d_gloo.test_ddp_comm_hook_register_just_once", test_ddp_comm_hook_register_just_once},
      {"test_c10d_common.test_invalid_powerSGD_state", test_invalid_powerSGD_state},
      {"test_c10d_common.test_single_limit_single_dtype", test_single_limit_single_dtype},
      {"test_c10d_common.test_single_limit_multi_dtype", test_single_limit_multi_dtype},
      {"test_c10d_common.test_multi_limit_single_dtype", test_multi_limit_single_dtype},
      {"test_c10d_common.test_multi_limit_multi_dtype", test_multi_limit_multi_dtype},
  };
}

}  // namespace ddp::testing::ported
