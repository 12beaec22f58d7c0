// Ported tests of post-local SGD: post_localSGD_hook against plain DDP
// (_test_ddp_hook_parity), PostLocalSGDOptimizer against SGD followed by
// the same model averager (periodic and hierarchical, gradients copied or
// bucket views), and the averager's step through a checkpoint file.
#include <filesystem>

#include "ported_case.h"

#include "../../support/warning_capture.h"
#include "ddp/optim/model_averaging.h"
#include "ddp/optim/post_local_sgd_optimizer.h"
#include "ddp/parallel/post_local_sgd_hook.h"

namespace ddp::testing::ported {

void test_ddp_hook_parity_post_localSGD(Out& out, std::shared_ptr<ProcessGroup> pg) {
  // The whole group as the subgroup: gradients stay averaged globally.
  ddp_hook_parity(out, pg, hooks::PostLocalSGDState(nullptr, pg, 10), hooks::post_localSGD_hook, nullptr,
                  "subgroup=WORLD ");
  // No gradient averaging from iteration 10 on: each rank's own (PyTorch
  // checks only the first 10; both sides write all of them).
  ddp_hook_parity(out, pg, hooks::PostLocalSGDState(nullptr, pg, 10, false), hooks::post_localSGD_hook, nullptr,
                  "post_local_gradient_allreduce=0 ");
  // The intra-node subgroups, made by the hook: on one node, every rank.
  ddp_hook_parity(out, pg, hooks::PostLocalSGDState(nullptr, nullptr, 10), hooks::post_localSGD_hook, nullptr,
                  "subgroup=None ");
}

namespace {

using AveragerMaker = std::function<std::shared_ptr<ModelAverager>()>;

std::shared_ptr<ModelAverager> periodic_model_averager() {
  return std::make_shared<PeriodicModelAverager>(4, 10);
}

std::shared_ptr<ModelAverager> hierarchical_model_averager() {
  return std::make_shared<HierarchicalModelAverager>(
      std::vector<std::pair<int64_t, int>>{{2, 2}, {4, dist::get_world_size()}}, 4);
}

PostLocalSGDOptimizer post_localSGD_optimizer(TestNet& net, double learning_rate,
                                              std::shared_ptr<ModelAverager> averager) {
  return PostLocalSGDOptimizer(
      std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(learning_rate)),
      std::move(averager));
}

void perform_a_train_step(torch::optim::Optimizer& optimizer, DistributedDataParallel<TestNetImpl>& net,
                          const torch::Tensor& input, const torch::Tensor& target) {
  optimizer.zero_grad();
  torch::mse_loss(net(input), target).backward();
  optimizer.step();
}

// _test_post_localSGD_optimizer_parity: SGD then averager.average_parameters
// by hand, against PostLocalSGDOptimizer, from the same model; each
// iteration's parameters, and whether the two models are bitwise equal.
void post_localSGD_optimizer_parity(Out& out, std::shared_ptr<ProcessGroup> pg, const AveragerMaker& create_averager,
                                    bool grad_is_view) {
  const double learning_rate = 0.03;
  const int world = pg->size();
  TestNet plain, local;
  DistributedDataParallel net(init(plain), pg, DDPOptions().gradient_as_bucket_view(grad_is_view));
  const auto averager = create_averager();
  torch::optim::SGD opt(plain->parameters(), torch::optim::SGDOptions(learning_rate));
  DistributedDataParallel net_using_post_localSGD_opt(init(local), pg,
                                                      DDPOptions().gradient_as_bucket_view(grad_is_view));
  const auto averager2 = create_averager();
  auto post_localSGD_opt = post_localSGD_optimizer(local, learning_rate, averager2);
  const auto input = data({world * 2, 2}, 1), target = data({world * 2, 4}, 2);
  for (int i = 0; i < 20; ++i) {
    perform_a_train_step(opt, net, input, target);
    averager->average_parameters(plain->parameters());
    perform_a_train_step(post_localSGD_opt, net_using_post_localSGD_opt, input, target);
    out.params(fmt("iteration %d", i), *local);
    bool same = true;
    for (size_t k = 0; k < plain->parameters().size(); ++k)
      same = same && torch::equal(plain->parameters()[k], local->parameters()[k]);
    out.text(fmt("iteration %d same as SGD and the averager", i), same ? 1 : 0);
  }
  out.text("averager.step", averager->step);
  out.text("averager2.step", averager2->step);
}

void test_post_localSGD_optimizer_parity(Out& out, std::shared_ptr<ProcessGroup> pg) {
  post_localSGD_optimizer_parity(out, pg, periodic_model_averager, false);
}

void test_post_localSGD_optimizer_parity_grad_is_view(Out& out, std::shared_ptr<ProcessGroup> pg) {
  post_localSGD_optimizer_parity(out, pg, periodic_model_averager, true);
}

// skip_if_odd_worldsize: the averager's groups of 2 need an even world.
void test_post_localSGD_optimizer_parity_with_hierarchical_sgd(Out& out, std::shared_ptr<ProcessGroup> pg) {
  if (pg->size() % 2 == 1) return out.text("skipped", "odd world size");
  post_localSGD_optimizer_parity(out, pg, hierarchical_model_averager, false);
}

void test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view(Out& out,
                                                                             std::shared_ptr<ProcessGroup> pg) {
  if (pg->size() % 2 == 1) return out.text("skipped", "odd world size");
  post_localSGD_optimizer_parity(out, pg, hierarchical_model_averager, true);
}

// _test_post_localSGD_optimizer_step_reload: rank 0 saves the optimizer
// after 20 steps to a file every rank loads into a second optimizer; then a
// checkpoint without "step" (PyTorch deletes it from the loaded dict; here
// the wrapped optimizer's own archive, which is all but "step") warns and
// resets the step to 0.
void test_post_localSGD_optimizer_step_reload(Out& out, std::shared_ptr<ProcessGroup> pg) {
  const double learning_rate = 0.03;
  const int world = pg->size();
  TestNet module;
  DistributedDataParallel net_using_post_localSGD_opt(init(module), pg);
  const auto averager = periodic_model_averager();
  auto post_localSGD_opt = post_localSGD_optimizer(module, learning_rate, averager);
  const auto averager2 = periodic_model_averager();
  auto dummy_post_localSGD_opt = post_localSGD_optimizer(module, learning_rate, averager2);
  const auto input = data({world * 2, 2}, 1), target = data({world * 2, 4}, 2);
  for (int i = 0; i < 20; ++i) perform_a_train_step(post_localSGD_opt, net_using_post_localSGD_opt, input, target);

  const std::filesystem::path dir = std::getenv("DDP_TEST_DIR");
  const std::string checkpoint = dir / "post_localSGD_cpp.pt", without_step = dir / "post_localSGD_cpp_no_step.pt";
  if (pg->rank() == 0) {
    torch::save(post_localSGD_opt, checkpoint);
    torch::save(post_localSGD_opt.optim(), without_step);
  }
  pg->barrier();
  torch::load(dummy_post_localSGD_opt, checkpoint);
  out.text("averager.step", averager->step);
  out.text("averager2.step after the load", averager2->step);

  WarningCapture warnings;
  torch::load(dummy_post_localSGD_opt, without_step);
  if (warnings.saw("Loaded state dict does not contain a step counter for an averager. Setting step counter to 0."))
    out.text("the load without a step", "warned");
  out.text("averager2.step after the load without a step", averager2->step);
  out.params("parameters", *module);
}

}  // namespace

Cases post_local_sgd_cases() {
  return {
      {"test_ddp_hook_parity_post_localSGD", test_ddp_hook_parity_post_localSGD},
      {"test_post_localSGD_optimizer_parity", test_post_localSGD_optimizer_parity},
      {"test_post_localSGD_optimizer_parity_grad_is_view", test_post_localSGD_optimizer_parity_grad_is_view},
      {"test_post_localSGD_optimizer_parity_with_hierarchical_sgd",
       test_post_localSGD_optimizer_parity_with_hierarchical_sgd},
      {"test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view",
       test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view},
      {"test_post_localSGD_optimizer_step_reload", test_post_localSGD_optimizer_step_reload},
  };
}

}  // namespace ddp::testing::ported
