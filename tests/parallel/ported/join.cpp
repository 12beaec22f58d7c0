// Ported tests of DDP under ddp::Join (PyTorch's net.join()): the division
// by the ranks still training or by the world, the model after uneven
// inputs, a disabled Join, an exception from the forward.
#include "ported_case.h"

#include "ddp/comm/dist.h"

namespace ddp::testing::ported {

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

// A model that communicates in its forward.
struct ModelWithCommImpl : nn::Module {
  ModelWithCommImpl() : lin(register_module("lin", nn::Linear(nn::LinearOptions(2, 40).bias(false)))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = lin(x);
    dist::all_reduce(x);
    return x;
  }
  nn::Linear lin;
};
TORCH_MODULE(ModelWithComm);

// The model that communicates in its forward; the SyncBatchNorm half is
// GPU-only in PyTorch.
void test_ddp_uneven_inputs_stop_iteration_sync_bn(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  ModelWithComm module;
  DistributedDataParallel model(init(module), pg);
  const auto model_input = data({10, 2}, rank);
  const int min_num_iters = 5, num_iters = rank == 0 ? 2 * min_num_iters : min_num_iters;
  int n = 0;
  const auto message = raised(out, "throw_on_early_termination", [&] {
    Join join({&model}, JoinOptions().throw_on_early_termination(true));
    for (int i = 0; i < num_iters; ++i) {
      model(model_input).sum().backward();
      step(*module);
      ++n;
    }
  });
  expect_names(message, {rank == 0 ? "detected at least one rank that exhausted inputs" : "exhausted all inputs"});
  out.text("iterations", n);
  out.params("after", *module);
}

Cases join_cases() {
  return {
      {"test_ddp_grad_div_uneven_inputs", test_ddp_grad_div_uneven_inputs},
      {"test_ddp_join_model_equivalence", test_ddp_join_model_equivalence},
      {"test_ddp_uneven_input_join_disable", test_ddp_uneven_input_join_disable},
      {"test_ddp_uneven_input_exception", test_ddp_uneven_input_exception},
      {"test_ddp_uneven_inputs_stop_iteration_sync_bn", test_ddp_uneven_inputs_stop_iteration_sync_bn},
  };
}

}  // namespace ddp::testing::ported
