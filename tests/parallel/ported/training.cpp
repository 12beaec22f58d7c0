// Ported tests of DDP's training semantics: a model trained as one process
// would (distributed_test.py's _test_DDP_niter), create_graph, requires_grad,
// gradient accumulation under no_sync with and without hooks, buffers, module
// states, evaluation, models DDP refuses.
#include "ported_case.h"

#include "ddp/comm/dist.h"

namespace ddp::testing::ported {

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

void test_ddp_hook_parity_allreduce(Out& out, std::shared_ptr<ProcessGroup> pg) {
  ddp_hook_parity(out, pg, std::shared_ptr<ProcessGroup>(), hooks::allreduce_hook, nullptr);
}

void test_ddp_hook_parity_allreduce_process_group(Out& out, std::shared_ptr<ProcessGroup> pg) {
  std::vector<int> ranks(pg->size());
  for (int r = 0; r < pg->size(); ++r) ranks[r] = r;
  const auto process_group = dist::new_group(ranks).process_group();
  ddp_hook_parity(out, pg, process_group, hooks::allreduce_hook, process_group);
}

void test_ddp_hook_parity_powerSGD(Out& out, std::shared_ptr<ProcessGroup> pg) {
  for (bool warm_start : {true, false}) {
    hooks::PowerSGDState state(
        nullptr, hooks::PowerSGDOptions().matrix_approximation_rank(1).start_powerSGD_iter(2).warm_start(warm_start));
    ddp_hook_parity(out, pg, std::move(state), hooks::powerSGD_hook, nullptr,
                    fmt("warm_start=%d ", warm_start));
  }
}


// test_ddp_logging_data_cpu (_test_ddp_logging_data on CPU): 20 iterations
// of TestNet, then the logging data's configuration and runtime keys. The
// values that name this run (ports, the module's class) are checked against
// it and written as 1; times as the orders the test checks. PyTorch samples
// its runtime figures (every 2nd step here); ours count every step, so
// "iteration" is the last sampled step there and the last step here: the
// port checks that it is at least the test's 18. gradient_as_bucket_view
// is checked against the option in effect, whose default differs.
void test_ddp_logging_data_cpu(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  TestNet net;
  DistributedDataParallel model(init(net), pg);
  const int local_bs = 2, global_bs = world * local_bs;
  const auto input = data({global_bs, 2}, 1), target = data({global_bs, 4}, 2);
  auto ints = [](const DDPLoggingData& d, const std::string& k, int64_t missing = -12345) {
    return d.ints_map.count(k) ? d.ints_map.at(k) : missing;
  };
  auto strs = [](const DDPLoggingData& d, const std::string& k) {
    return d.strs_map.count(k) ? d.strs_map.at(k) : std::string("None");
  };
  for (int idx = 0; idx < 20; ++idx) {
    const int offset = rank * local_bs;
    torch::mse_loss(model(input.slice(0, offset, offset + local_bs)), target.slice(0, offset, offset + local_bs))
        .backward();
    step_with_zero_grad(*net);
    const auto d = model.get_ddp_logging_data();
    if (idx > 0 && (idx < 10 || idx % 2 == 0)) {
      const bool ok = ints(d, "forward_compute_time") >= 1 && ints(d, "backward_compute_time") >= 1 &&
                      ints(d, "backward_comm_time") >= 1 &&
                      ints(d, "backward_compute_time") >= ints(d, "backward_compute_comm_overlap_time") &&
                      ints(d, "backward_comm_time") >= ints(d, "backward_compute_comm_overlap_time");
      out.text(fmt("iteration %d runtime figures in order", idx), ok ? 1 : 0);
    }
  }
  const auto d = model.get_ddp_logging_data();
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "N/A");
  };
  for (const char* k : {"world_size", "rank", "output_device", "broadcast_buffers", "bucket_cap_bytes",
                        "find_unused_parameters", "total_parameter_size_bytes",
                        "num_parameter_tensors", "has_rebuilt_buckets", "gloo_num_threads"})
    out.text(k, ints(d, k));
  out.text("unused_parameter_size", ints(d, "unused_parameter_size", 0));
  for (const char* k : {"device_ids", "backend_name", "dtypes", "bucket_sizes", "rebuilt_bucket_sizes",
                        "prev_iteration_grad_ready_order_indices", "rebuilt_per_bucket_param_indices",
                        "nccl_socket_ifname", "nccl_blocking_wait", "nccl_async_error_handling", "nccl_debug",
                        "nccl_nthreads", "nccl_ib_timeout"})
    out.text(k, "'" + strs(d, k) + "'");
  out.text("module_name is the module's class", strs(d, "module_name") == net->name() ? 1 : 0);
  out.text("iteration at least 18", ints(d, "iteration") >= 18 ? 1 : 0);
  // On by default here, off in PyTorch (ddp_options.h): the key says which is in effect.
  out.text("gradient_as_bucket_view is the option in effect",
           ints(d, "gradient_as_bucket_view") == model.options().gradient_as_bucket_view() ? 1 : 0);
  out.text("environment", strs(d, "master_port") == env("MASTER_PORT") && strs(d, "master_addr") == env("MASTER_ADDR") &&
                                  strs(d, "torch_distributed_debug") == env("TORCH_DISTRIBUTED_DEBUG") &&
                                  strs(d, "cuda_visible_devices") == env("CUDA_VISIBLE_DEVICES") &&
                                  strs(d, "gloo_socket_ifname") == env("GLOO_SOCKET_IFNAME") &&
                                  strs(d, "gloo_device_transport") == env("GLOO_DEVICE_TRANSPORT")
                              ? 1
                              : 0);
  const bool averages = ints(d, "avg_forward_compute_time") >= 1 && ints(d, "avg_backward_compute_time") >= 1 &&
                        ints(d, "avg_backward_comm_time") >= 1 &&
                        ints(d, "avg_backward_compute_time") >= ints(d, "avg_backward_compute_comm_overlap_time") &&
                        ints(d, "avg_backward_comm_time") >= ints(d, "avg_backward_compute_comm_overlap_time");
  out.text("average figures in order", averages ? 1 : 0);
  const bool host_times = ints(d, "backward_comm_time_end") >= ints(d, "backward_comm_time_start") &&
                          ints(d, "backward_comm_time_start") >= ints(d, "backward_compute_time_start") &&
                          ints(d, "backward_compute_time_end") >= ints(d, "backward_compute_time_start") &&
                          ints(d, "backward_compute_time_start") >= ints(d, "forward_compute_time_start");
  out.text("host-side times in order", host_times ? 1 : 0);
}


struct LargeNetImpl : nn::Module {
  LargeNetImpl(int64_t in, int64_t hidden, int64_t out_features, bool second_used)
      : second_used(second_used) {
    fc1 = register_module("fc1", nn::Linear(nn::LinearOptions(in, hidden).bias(false)));
    fc2 = register_module("fc2", nn::Linear(nn::LinearOptions(second_used ? hidden : in, out_features).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return second_used ? fc2(fc1(x)) : fc1(x); }
  nn::Linear fc1{nullptr}, fc2{nullptr};
  bool second_used;
};
TORCH_MODULE(LargeNet);

// With bucket_cap_mb_list {1, 2} and without (bucket_cap_mb 25): two
// iterations each; the caps in bytes, the first buckets' sizes, the gradients.
void test_ddp_bucket_cap_mb_list(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank();
  for (bool with_list : {true, false}) {
    const std::string label = with_list ? "with the list" : "without";
    LargeNet net(1000, 2000, 500, true);
    DistributedDataParallel model(init(net), pg,
                                  with_list ? DDPOptions().bucket_cap_mb_list({1, 2}) : DDPOptions().bucket_cap_mb(25));
    for (int it = 0; it < 2; ++it) model(data({10, 1000}, rank + it)).sum().backward();
    std::string caps = "[";
    for (auto c : model.bucket_bytes_cap_list()) caps += (caps.size() > 1 ? "," : "") + std::to_string(c);
    out.text(label + " bucket_bytes_cap_list", caps + "]");
    const auto d = model.get_ddp_logging_data();
    out.text(label + " bucket_cap_bytes", d.ints_map.at("bucket_cap_bytes"));
    if (with_list) out.text(label + " bucket_sizes", d.strs_map.at("bucket_sizes"));
    grad_checksums(out, label, *net);
  }
}

// _test_skip_all_reduce_unused_parameters with and without the option: fc2
// never used, buckets of 1.5 MiB, ten iterations.
void test_skip_all_reduce_unused_parameters(Out& out, std::shared_ptr<ProcessGroup> pg) {
  for (bool skip : {false, true}) {
    LargeNet net(100, 5000, 100, false);
    DistributedDataParallel ddp_model(
        init(net), pg,
        DDPOptions().find_unused_parameters(true).static_graph(false).bucket_cap_mb(1.5).skip_all_reduce_unused_params(
            skip));
    const auto random_input = data({20, 100}, pg->rank());
    for (int i = 0; i < 10; ++i) ddp_model(random_input).sum().backward();
    const std::string label = fmt("skip_all_reduce_unused_params=%d", skip);
    out.text(label + " num_buckets_reduced", ddp_model.get_ddp_logging_data().ints_map.at("num_buckets_reduced"));
    grad_checksums(out, label, *net);
    checksums(out, label, *net);
  }
}

Cases training_cases() {
  return {
      {"test_DistributedDataParallelCPU", test_DistributedDataParallelCPU},
      {"test_DistributedDataParallelCPU_grad_is_view", test_DistributedDataParallelCPU_grad_is_view},
      {"test_DistributedDataParallel_requires_grad", test_DistributedDataParallel_requires_grad},
      {"test_ddp_create_graph", test_ddp_create_graph},
      {"test_ddp_sync_module_states", test_ddp_sync_module_states},
      {"test_accumulate_gradients_no_sync", test_accumulate_gradients_no_sync},
      {"test_accumulate_gradients_no_sync_grad_is_view", test_accumulate_gradients_no_sync_grad_is_view},
      {"test_accumulate_gradients_no_sync_allreduce_hook", test_accumulate_gradients_no_sync_allreduce_hook},
      {"test_accumulate_gradients_no_sync_allreduce_with_then_hook", test_accumulate_gradients_no_sync_allreduce_with_then_hook},
      {"test_ddp_broadcast_buffer", test_ddp_broadcast_buffer},
      {"test_ddp_inference", test_ddp_inference},
      {"ddp_evaluation_after_training", ddp_evaluation_after_training},
      {"test_ddp_model_diff_shape_across_ranks", test_ddp_model_diff_shape_across_ranks},
      {"test_ddp_model_diff_num_params_across_ranks", test_ddp_model_diff_num_params_across_ranks},
      {"test_ddp_zero_output_features", test_ddp_zero_output_features},
      {"test_ddp_hook_parity_allreduce", test_ddp_hook_parity_allreduce},
      {"test_ddp_hook_parity_allreduce_process_group", test_ddp_hook_parity_allreduce_process_group},
      {"test_ddp_hook_parity_powerSGD", test_ddp_hook_parity_powerSGD},
      {"test_ddp_logging_data_cpu", test_ddp_logging_data_cpu},
      {"test_ddp_bucket_cap_mb_list", test_ddp_bucket_cap_mb_list},
      {"test_skip_all_reduce_unused_parameters", test_skip_all_reduce_unused_parameters},
  };
}

}  // namespace ddp::testing::ported
