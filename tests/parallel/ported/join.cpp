// Ported tests of DDP under ddp::Join (PyTorch's net.join()): the division
// by the ranks still training or by the world, the model after uneven
// inputs (every model and mapping of test_ddp_uneven_inputs), a disabled
// Join, an exception from the forward.
#include "ported_case.h"

#include <algorithm>
#include <optional>

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


// test_ddp_uneven_inputs: every model and rank-to-iterations mapping of the
// original on CPU, the dimension 1000 shrunk to 24 and the bucket cap with it
// (1 to 0.25 MiB: the conv model still spans several buckets); ResNet-50
// left out (torchvision). Each run wraps the same module again, as the
// original; it writes its iterations, its error (on early termination) and
// the module's checksums after Join.
struct UnevenParamModuleImpl : nn::Module {  // the test's UnusedParamModule
  explicit UnevenParamModuleImpl(int unused_params_rank) : unused_params_rank(unused_params_rank) {
    t0 = register_module("t0", Task());
    t1 = register_module("t1", Task());
  }
  torch::Tensor forward(torch::Tensor x, int rank) { return rank != unused_params_rank ? t1(t0(x)) : t1(x); }
  Task t0{nullptr}, t1{nullptr};
  int unused_params_rank;
};
TORCH_MODULE(UnevenParamModule);

enum class UnevenHook { none, allreduce, powerSGD };

struct UnevenRun {
  std::string name;
  int sync_interval = 1;
  bool throw_on_early_termination = false;
  UnevenHook hook = UnevenHook::none;
};

// _run_uneven_inputs_test for one model, one case and one mapping.
template <typename Holder, typename Forward>
void run_uneven_inputs_test(Out& out, const std::shared_ptr<ProcessGroup>& pg, Holder& model, Forward forward,
                            const UnevenRun& run, const std::vector<int>& mapping,
                            const std::shared_ptr<hooks::PowerSGDState>& power_sgd_state) {
  const int rank = pg->rank();
  std::string label = run.name + " sync " + std::to_string(run.sync_interval) +
                      (run.throw_on_early_termination ? " throw " : " ");
  for (size_t r = 0; r < mapping.size(); ++r) label += (r ? "," : "") + std::to_string(mapping[r]);
  pg->barrier();
  DistributedDataParallel net(model, pg,
                              DDPOptions().bucket_cap_mb(0.25).find_unused_parameters(
                                  run.name.find("unused_params_model") != std::string::npos));
  if (run.hook == UnevenHook::allreduce) net.register_comm_hook(std::shared_ptr<ProcessGroup>(), hooks::allreduce_hook);
  if (run.hook == UnevenHook::powerSGD)
    net.register_comm_hook(power_sgd_state, [](std::shared_ptr<hooks::PowerSGDState>& state, GradBucket& bucket) {
      return hooks::powerSGD_hook(*state, bucket);
    });
  int total_iters = 0;
  auto train = [&] {
    Join join({&net}, JoinOptions().throw_on_early_termination(run.throw_on_early_termination));
    for (int i = 0; i < mapping[rank]; ++i) {
      std::optional<DistributedDataParallelBase::NoSyncGuard> no_sync;
      if (i % run.sync_interval != 0) no_sync.emplace(net);
      forward(net).sum().backward();
      step(*model);
      ++total_iters;
    }
  };
  if (run.throw_on_early_termination) {
    const int min_iters = *std::min_element(mapping.begin(), mapping.end());
    const auto message = raised(out, label, train);
    expect_names(message, {mapping[rank] == min_iters ? "exhausted all inputs"
                                                      : "detected at least one rank that exhausted inputs"});
  } else {
    train();
  }
  out.text(label + " iterations", total_iters);
  if (!run.throw_on_early_termination)
    out.text(label + " join_uneven_inputs", net.get_ddp_logging_data().ints_map.at("join_uneven_inputs"));
  checksums(out, label, *model);
}

void test_ddp_uneven_inputs(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size(), dim = 24, batch = 1;
  nn::Sequential large_model(nn::Conv2d(1, 20, 5), nn::ReLU(), nn::Conv2d(20, 32, 5), nn::ReLU(),
                             nn::Conv2d(32, 256, 5), nn::ReLU());
  nn::Linear small_model(nn::LinearOptions(dim, dim).bias(false));
  BatchNormNet bn_net;
  UnevenParamModule unjoined(1), joined(0);
  init(large_model);
  init(small_model);
  init(bn_net);
  init(unjoined);
  init(joined);
  auto power_sgd_state = std::make_shared<hooks::PowerSGDState>(
      nullptr,
      hooks::PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(1).warm_start(false).use_error_feedback(
          false));
  std::vector<std::vector<int>> mappings;
  // One rank joining early at 2 ranks; at 3, two joining at different
  // iterations (the original runs both at 3): between their joins two ranks
  // train beside one shadowing, the 1-early case, so 3 ranks run half as many.
  for (int num_early_join_ranks : {world > 2 ? 2 : 1}) {
    for (int baseline_iter : {0, 5}) {
      for (int offset : {2, 3, 10}) {
        std::vector<int> mapping(world, baseline_iter + offset);
        for (int r = 0; r < num_early_join_ranks; ++r) mapping[r] = baseline_iter + (r > 0 ? offset / 2 : 0);
        mappings.push_back(mapping);
      }
    }
  }
  const std::vector<std::pair<std::string, UnevenHook>> models = {
      {"batch_norm_net", UnevenHook::none},
      {"large_conv_model", UnevenHook::none},
      {"small_model", UnevenHook::none},
      {"unjoined_rank_with_unused_params_model", UnevenHook::none},
      {"joined_rank_with_unused_params_model", UnevenHook::none},
      {"small_model_allreduce_hook", UnevenHook::allreduce},
      {"small_model_power_sgd_hook", UnevenHook::powerSGD}};
  std::vector<UnevenRun> runs;  // the hooks only in the first set, as the original
  for (const auto& [name, hook] : models) runs.push_back({name, 1, false, hook});
  for (size_t i = 0; i < models.size(); ++i) runs.push_back({models[i].first, static_cast<int>(i) + 2, false});
  for (const auto& [name, hook] : models) runs.push_back({name, 1, true});
  const auto ones_2 = torch::ones({batch, 2}), ones_dim = torch::ones({batch, dim});
  const auto ones_image = torch::ones({batch, batch, dim, dim});
  for (const auto& run : runs) {
    for (const auto& mapping : mappings) {
      if (run.name == "batch_norm_net")
        run_uneven_inputs_test(out, pg, bn_net, [&](auto& net) { return net(ones_2); }, run, mapping, power_sgd_state);
      else if (run.name == "large_conv_model")
        run_uneven_inputs_test(out, pg, large_model, [&](auto& net) { return net(ones_image); }, run, mapping,
                               power_sgd_state);
      else if (run.name.rfind("small_model", 0) == 0)
        run_uneven_inputs_test(out, pg, small_model, [&](auto& net) { return net(ones_dim); }, run, mapping,
                               power_sgd_state);
      else
        run_uneven_inputs_test(out, pg, run.name[0] == 'u' ? unjoined : joined,
                               [&](auto& net) { return net(ones_2, rank); }, run, mapping, power_sgd_state);
    }
  }
}

Cases join_cases() {
  return {
      {"test_ddp_grad_div_uneven_inputs", test_ddp_grad_div_uneven_inputs},
      {"test_ddp_join_model_equivalence", test_ddp_join_model_equivalence},
      {"test_ddp_uneven_input_join_disable", test_ddp_uneven_input_join_disable},
      {"test_ddp_uneven_input_exception", test_ddp_uneven_input_exception},
      {"test_ddp_uneven_inputs_stop_iteration_sync_bn", test_ddp_uneven_inputs_stop_iteration_sync_bn},
      {"test_ddp_uneven_inputs", test_ddp_uneven_inputs},
  };
}

}  // namespace ddp::testing::ported
