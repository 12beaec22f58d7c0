// State dicts and checkpoints that load anywhere: round trips, Python's files
// (module. prefixes, CUDA-tagged storages), LibTorch archives, and files that
// are truncated, corrupt or foreign.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "../support/multiprocess.h"
#include "../support/located.h"
#include "ddp/train/checkpoint.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/state_dict.h"
#include "../support/idx_fixture.h"
#include "python_run.h"
#include "../support/python_server.h"

namespace fs = std::filesystem;

namespace {

torch::nn::Sequential small_net() {
  return torch::nn::Sequential(torch::nn::Linear(3, 2), torch::nn::BatchNorm1d(2));
}

using ddp::testing::python_torch;

std::string checkpoint_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::CheckpointError& e) {
    return e.what();
  }
  return "";
}

// A world of one for save_checkpoint/load_checkpoint.
std::shared_ptr<ddp::ProcessGroup> single_group() {
  ddp::LaunchEnv env;
  env.master_port = static_cast<uint16_t>(ddp::testing::free_port());
  return ddp::init_process_group(env, ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
}

}  // namespace

TEST(StateDict, RoundTripThroughOurFile) {
  const auto dir = ddp::testing::temp_dir("sd");
  torch::manual_seed(1);
  auto a = small_net(), b = small_net();
  a->forward(torch::randn({4, 3}));  // moves BatchNorm's running stats
  ddp::save_state_dict(*a, dir + "/model.pt");
  ddp::load_state_dict(*b, ddp::read_state_dict(dir + "/model.pt"));
  auto sa = ddp::state_dict(*a), sb = ddp::state_dict(*b);
  ASSERT_EQ(sa.size(), 7u);
  for (auto& item : sa) EXPECT_TRUE(torch::equal(item.value(), sb[item.key()])) << item.key();
  EXPECT_FALSE(fs::exists(dir + "/model.pt.tmp"));
  fs::remove_all(dir);
}

TEST(StateDict, StripsModulePrefixes) {
  auto net = small_net();
  ddp::StateDict wrapped;
  for (auto& item : ddp::state_dict(*net)) wrapped.insert("module.module." + item.key(), item.value() + 1);
  ddp::load_state_dict(*net, wrapped);
  EXPECT_TRUE(torch::equal(net->named_parameters()["0.bias"], wrapped["module.module.0.bias"]));
}

TEST(StateDict, MismatchListsMissingUnexpectedAndShapes) {
  auto net = small_net();
  ddp::StateDict sd = ddp::state_dict(*net);
  ddp::StateDict wrong;
  for (auto& item : sd)
    if (item.key() != "0.bias") wrong.insert(item.key(), item.key() == "0.weight" ? torch::zeros({3, 3}) : item.value());
  wrong.insert("extra.weight", torch::zeros({1}));
  const auto msg = checkpoint_error([&] { ddp::load_state_dict(*net, wrong); });
  EXPECT_NE(msg.find("missing: 0.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected: extra.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.weight (file [3, 3], model [2, 3])"), std::string::npos) << msg;
}

TEST(StateDict, ReadsLibTorchModuleArchives) {
  const auto dir = ddp::testing::temp_dir("sd_archive");
  auto a = small_net(), b = small_net();
  torch::save(a, dir + "/module.pt");
  ddp::load_state_dict(*b, ddp::read_state_dict(dir + "/module.pt"));
  EXPECT_TRUE(torch::equal(a->named_parameters()["0.weight"], b->named_parameters()["0.weight"]));
  fs::remove_all(dir);
}

TEST(StateDict, ReadsPythonDataParallelStateDictSavedOnGpu) {
  if (!python_torch()) GTEST_SKIP() << "/usr/bin/python3 with torch not available";
  const auto dir = ddp::testing::temp_dir("sd_python");
  ASSERT_EQ(ddp::testing::python_script(PYTHON_STATE_DICTS, {dir}), "ok\n");
  auto net = small_net();
  // The seeds' two classic errors: module. prefixes and CUDA storages on a CPU-only machine.
  ddp::load_state_dict(*net, ddp::read_state_dict(dir + "/dp_cuda.pt"));
  auto sd = ddp::state_dict(*net);
  EXPECT_TRUE(torch::equal(sd["0.weight"], torch::arange(6, torch::kFloat).reshape({2, 3}) * 0.5));
  EXPECT_TRUE(torch::equal(sd["0.bias"], torch::tensor({-1.0f, 1.0f})));
  EXPECT_TRUE(torch::equal(sd["1.running_var"], torch::full({2}, 3.0f)));
  EXPECT_EQ(sd["1.num_batches_tracked"].item<int64_t>(), 7);
  // A Python checkpoint dict with the state under "model_state_dict".
  auto other = small_net();
  ddp::load_state_dict(*other, ddp::read_state_dict(dir + "/ckpt_dict.pt"));
  EXPECT_TRUE(torch::equal(ddp::state_dict(*other)["1.bias"], torch::full({2}, 0.25f)));
  fs::remove_all(dir);
}

TEST(StateDict, ForeignTruncatedAndEmptyFilesAreClearErrors) {
  const auto dir = ddp::testing::temp_dir("sd_bad");
  auto net = small_net();
  ddp::save_state_dict(*net, dir + "/good.pt");
  const auto size = fs::file_size(dir + "/good.pt");
  fs::copy_file(dir + "/good.pt", dir + "/cut.pt");
  fs::resize_file(dir + "/cut.pt", size / 2);
  std::ofstream(dir + "/text.pt") << "epoch,loss\n1,0.5\n";
  std::ofstream(dir + "/empty.pt");
  // Not a structured binding: the lambda below captures `file`, which clang
  // before 16 refuses (C++20); the sanitized build uses clang.
  for (const auto& [file_, needle] : std::vector<std::pair<std::string, std::string>>{
           {"cut.pt", "truncated or corrupt"},
           {"text.pt", "not a PyTorch file"},
           {"empty.pt", "the file is empty"},
           {"none.pt", "cannot open"}}) {
    const std::string& file = file_;
    const auto msg = checkpoint_error([&] { ddp::read_state_dict(dir + "/" + file); });
    EXPECT_NE(msg.find(needle), std::string::npos) << file << ": " << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << "names the file: " << msg;
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, RoundTripRestoresEverythingAndPythonReadsIt) {
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("ckpt");
  torch::manual_seed(3);
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    net->forward(torch::randn({8, 3})).pow(2).mean().backward();
    opt.step();
  }
  ddp::TrainState state;
  state.epoch = 2;
  state.step = 3;
  state.sampler_epoch = 2;
  state.config = {{"lr", "0.1"}};
  const std::string path = dir + "/checkpoint.pt";
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  const auto next_random = torch::rand({4});  // what the generator gives after the save

  // A fresh model and optimizer, then one step of each: identical only if momentum came back.
  torch::manual_seed(99);
  auto net2 = small_net();
  torch::optim::SGD opt2(net2->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto restored = ddp::load_checkpoint(path, *net2, &opt2, *pg);
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_random)) << "the RNG state is restored";
  EXPECT_EQ(restored.epoch, 2);
  EXPECT_EQ(restored.step, 3);
  EXPECT_EQ(restored.sampler_epoch, 2);
  EXPECT_EQ(restored.world_size, 1);
  EXPECT_EQ(restored.config["lr"], "0.1");
  auto x = torch::randn({8, 3});
  for (auto [n, o] : {std::pair{&net, &opt}, std::pair{&net2, &opt2}}) {
    o->zero_grad();
    (*n)->forward(x).pow(2).mean().backward();
    o->step();
  }
  for (auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), net2->named_parameters()[p.key()])) << p.key();

  // A second save keeps the first as checkpoint.prev.pt.
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  EXPECT_TRUE(fs::exists(dir + "/checkpoint.prev.pt"));
  if (python_torch()) {
    const auto out = ddp::testing::python_script(PYTHON_CHECKS, {"checkpoint", path});
    EXPECT_EQ(out.rfind("epoch 2 step 3 world 1 tensors 7", 0), 0u) << out;
  }
  ddp::destroy_process_group();
  fs::remove_all(dir);
}

TEST(Checkpoint, TruncatedFallsBackToPreviousAndForeignIsRefused) {
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("ckpt_bad");
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  ddp::TrainState state;
  const std::string path = dir + "/checkpoint.pt";
  state.epoch = 1;
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  state.epoch = 2;
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  fs::resize_file(path, fs::file_size(path) / 3);  // a torn write by something else, or a bad disk
  EXPECT_EQ(ddp::load_checkpoint(path, *net, &opt, *pg).epoch, 1) << "the previous good checkpoint";
  fs::resize_file(dir + "/checkpoint.prev.pt", 100);
  auto msg = checkpoint_error([&] { ddp::load_checkpoint(path, *net, &opt, *pg); });
  EXPECT_NE(msg.find("rank 0/1: cannot resume"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is no better"), std::string::npos) << msg;

  ddp::save_state_dict(*net, dir + "/model.pt");  // a model file, not a checkpoint
  msg = checkpoint_error([&] { ddp::load_checkpoint(dir + "/model.pt", *net, &opt, *pg); });
  EXPECT_NE(msg.find("not a libddp checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("read_state_dict"), std::string::npos) << "says what to do instead: " << msg;

  // Another model: the names are listed, nothing is half-loaded silently.
  torch::nn::Sequential other(torch::nn::Linear(3, 4));
  torch::optim::SGD other_opt(other->parameters(), 0.1);
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  msg = checkpoint_error([&] { ddp::load_checkpoint(path, *other, &other_opt, *pg); });
  EXPECT_NE(msg.find("does not fit the model"), std::string::npos) << msg;
  ddp::destroy_process_group();
  fs::remove_all(dir);
}

// An enabled ddp::GradScaler travels with the checkpoint as PyTorch's
// GradScaler.state_dict() (the same keys and types, so torch.load users can
// hand it to theirs); a disabled one leaves no entry; a checkpoint without
// one leaves an enabled scaler at its initial scale.
TEST(Checkpoint, CarriesAnEnabledLossScalerAsPyTorchsStateDict) {
  auto pg = single_group();
  const auto dir = ddp::testing::temp_dir("ckpt_scaler");
  const std::string path = dir + "/checkpoint.pt", plain = dir + "/plain.pt";
  auto net = small_net();
  torch::optim::SGD opt(net->parameters(), 0.1);
  ddp::GradScaler scaler(pg, ddp::GradScalerOptions().init_scale(256).growth_interval(5).growth_factor(3).backoff_factor(0.25));
  for (int step = 0; step < 3; ++step) {  // a skipped step, then two good ones: scale 64, tracker 2
    opt.zero_grad();
    auto loss = net->forward(torch::ones({2, 3})).sum() * (step == 0 ? INFINITY : 1.0);
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  ddp::TrainState state;
  state.scaler = &scaler;
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  ddp::GradScaler disabled(pg, ddp::GradScalerOptions().enabled(false));
  state.scaler = &disabled;
  ddp::save_checkpoint(plain, *net, opt, state, *pg);

  ddp::GradScaler restored(pg);
  auto loaded = ddp::load_checkpoint(path, *net, &opt, *pg, &restored);
  EXPECT_EQ(loaded.scaler, &restored);
  EXPECT_EQ(restored.get_scale(), 64.0);
  EXPECT_EQ(restored.get_growth_tracker(), 2);
  EXPECT_EQ(restored.get_growth_interval(), 5);
  EXPECT_EQ(restored.get_growth_factor(), 3.0);
  EXPECT_EQ(restored.get_backoff_factor(), 0.25);

  ddp::GradScaler fresh(pg);
  ddp::load_checkpoint(plain, *net, &opt, *pg, &fresh);
  EXPECT_EQ(fresh.get_scale(), 65536.0) << "no scaler entry: the initial scale";
  if (python_torch()) {
    EXPECT_EQ(ddp::testing::python_script(PYTHON_CHECKS, {"scaler", path}),
              "scale float 64.0\ngrowth_factor float 3.0\nbackoff_factor float 0.25\ngrowth_interval int 5\n"
              "_growth_tracker int 2\n");
    EXPECT_EQ(ddp::testing::python_script(PYTHON_CHECKS, {"scaler", plain}), "no scaler\n");
  }
  ddp::destroy_process_group();
  fs::remove_all(dir);
}
