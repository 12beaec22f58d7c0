// Files from outside treated as hostile: archives that carry
// TorchScript code never run it (the payload would create a file), pickles
// and zips that would cost gigabytes are refused by what the file holds,
// special files are refused without blocking, writes never follow a link
// planted in a run folder, rotation never loses the last good checkpoint,
// and a checkpoint's counts are range-checked.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "../support/multiprocess.h"
#include "../support/located.h"
#include "crafted_files.h"
#include "../support/idx_fixture.h"
#include "../support/python_server.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/run_dir.h"
#include "ddp/train/state_dict.h"

namespace fs = std::filesystem;
using namespace ddp::crafted;

namespace {

std::shared_ptr<ddp::ProcessGroup> single_group() {
  ddp::LaunchEnv env;
  env.master_port = static_cast<uint16_t>(ddp::testing::free_port());
  return ddp::init_process_group(env, ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The CheckpointError `f` throws ("" if none, "other: ..." for another exception).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "";
}

class UntrustedFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ddp::testing::temp_dir("untrusted"); }
  void TearDown() override {
    ddp::destroy_process_group();
    fs::remove_all(dir_);
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // The code archives of python_code_archives.py; their payload creates `victim`.
  void make_code_archives() {
    victim_ = dir_ + "/victim";
    ASSERT_EQ(ddp::testing::python_script(PYTHON_CODE_ARCHIVES, {dir_, victim_}).rfind("FAILED", 0), std::string::npos);
    ASSERT_FALSE(fs::exists(victim_));
  }
  std::string dir_, victim_;
};

}  // namespace

// ---- 1. no code from a file runs -------------------------------------------

TEST_F(UntrustedFiles, CodeInACheckpointsOptimizerStateNeverRuns) {
  make_code_archives();
  auto pg = single_group();
  torch::nn::Linear net(3, 2);
  torch::optim::SGD opt(net->parameters(), 0.1);
  const auto err = error_of([&] { ddp::load_checkpoint(dir_ + "/code_checkpoint.pt", *net, &opt, *pg); });
  EXPECT_FALSE(fs::exists(victim_)) << "the archive's __setstate__ ran";
  EXPECT_NE(err.find("code_checkpoint.pt"), std::string::npos) << err;
  EXPECT_NE(err.find("__setstate__"), std::string::npos) << err;
  EXPECT_NE(err.find("never run"), std::string::npos) << err;
}

TEST_F(UntrustedFiles, CodeInALibTorchArchiveNeverRunsThroughReadStateDictOrReadArchive) {
  make_code_archives();
  const std::string path = dir_ + "/code_module.pt";
  const auto a = error_of([&] { ddp::read_state_dict(path); });
  const auto b = error_of([&] { ddp::read_archive(path); });
  EXPECT_FALSE(fs::exists(victim_)) << "the archive's __setstate__ ran";
  for (const auto& err : {a, b}) {
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(err.find("__setstate__"), std::string::npos) << err;
  }
}

// read_archive in place of torch::load: every LibTorch optimizer's state
// comes back whole (deques, optionals, tuples, empty lists).
TEST_F(UntrustedFiles, EveryLibTorchOptimizersStateRoundTripsThroughReadArchive) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;
  const std::vector<std::pair<std::string, Make>> kinds{
      {"SGD", [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true)); }},
      {"Adam", [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01).amsgrad(true)); }},
      {"AdamW", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01)); }},
      {"Adagrad", [](auto p) { return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1)); }},
      {"RMSprop", [](auto p) { return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(0.01).centered(true).momentum(0.5)); }},
      {"LBFGS", [](auto p) { return std::make_unique<torch::optim::LBFGS>(p, torch::optim::LBFGSOptions(0.5).history_size(3)); }},
  };
  for (const auto& [name, make] : kinds) {
    torch::manual_seed(7);
    torch::nn::Linear a(4, 3), b(4, 3);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
    }
    auto x = torch::randn({8, 4});
    auto step = [&](torch::nn::Linear& net, torch::optim::Optimizer& opt) {
      opt.step([&] {
        opt.zero_grad();
        auto loss = net->forward(x).pow(2).mean();
        loss.backward();
        return loss;
      });
    };
    auto opt_a = make(a->parameters());
    step(a, *opt_a);
    step(a, *opt_a);
    const std::string path = dir_ + "/" + name + ".pt";
    torch::save(*opt_a, path);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
    }
    auto opt_b = make(b->parameters());
    auto archive = ddp::read_archive(path);
    opt_b->load(archive);
    step(a, *opt_a);
    step(b, *opt_b);
    for (size_t i = 0; i < a->parameters().size(); ++i)
      EXPECT_TRUE(torch::equal(a->parameters()[i], b->parameters()[i])) << name << ": parameter " << i;
  }
}

// ---- 4. memory bounded by what the file holds ------------------------------

TEST_F(UntrustedFiles, APickleThatWouldBuildGigabytesOfValuesIsRefusedNamingTheFile) {
  // Four million one-byte NONEs: about a gigabyte of values before the fix.
  const std::string pkl = "\x80\x02(" + std::string(4 << 20, 'N') + "l.";
  for (bool deflate : {true, false}) {
    const std::string name = deflate ? "nones_deflated.pt" : "nones_stored.pt";
    const auto path = write(name, make_zip({{"archive/data.pkl", pkl, false, deflate}}).bytes);
    const auto err = error_of([&] { ddp::read_state_dict(path); });
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(err.find("MiB of values"), std::string::npos) << err;
  }
}

TEST_F(UntrustedFiles, ADeflatedEntryClaimingAGigabyteIsRefusedNamingTheEntry) {
  std::string noise(1 << 20, '\0');
  uint32_t x = 1;
  for (auto& c : noise) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);  // incompressible
  auto entries = archive(state_dict_pkl({}));
  entries[1].data = noise;
  entries[1].deflate = true;
  entries[1].claimed_size = uint64_t(1) << 30;  // within deflate's best ratio of the 1 MiB it holds
  const auto path = write("gigabyte.pt", make_zip(entries).bytes);
  const auto err = error_of([&] { ddp::read_state_dict(path); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("archive/data/0"), std::string::npos) << err;
  EXPECT_NE(err.find("inflate"), std::string::npos) << err;
}

TEST_F(UntrustedFiles, AStrideZeroViewClaimingGigabytesIsRefused) {
  TensorSpec t;
  t.sizes = {int64_t(1) << 30};
  t.strides = {0};
  const auto path = write("expanded.pt", make_zip(archive(state_dict_pkl(t))).bytes);
  const auto err = error_of([&] { ddp::read_state_dict(path); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("tensors claiming more than"), std::string::npos) << err;
}

TEST_F(UntrustedFiles, ADictOfManyKeysIsReadInLinearTime) {
  // 150,000 distinct keys: before the hash index, 10^10 string comparisons.
  std::string pkl = "\x80\x02}(";
  for (int k = 0; k < 150000; ++k) pkl += str("k" + std::to_string(k)) + "N";
  pkl += "u.";
  const auto path = write("wide.pt", make_zip({{"archive/data.pkl", pkl}}).bytes);
  const auto err = error_of([&] { ddp::read_state_dict(path); });
  EXPECT_NE(err.find("holds no model state"), std::string::npos) << err;
}

TEST_F(UntrustedFiles, SpecialFilesAreRefusedWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo.pt", sparse = dir_ + "/sparse.pt", sparse_zip = dir_ + "/sparse_zip.pt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::resize_file(write("sparse.pt", ""), uint64_t(2) << 30);
  fs::resize_file(write("sparse_zip.pt", "PK\x03\x04"), uint64_t(2) << 30);
  for (const std::string path : {std::string("/dev/zero"), fifo, dir_, sparse, sparse_zip}) {
    const auto err = error_of([&] { ddp::read_state_dict(path); });
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_EQ(err.rfind("other:", 0), std::string::npos) << err;
  }
  EXPECT_NE(error_of([&] { ddp::read_state_dict(fifo); }).find("a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { ddp::read_state_dict(sparse_zip); }).find("no end of central directory"), std::string::npos);
}

// ---- 5. no write leaves the run folder through a link ----------------------

TEST_F(UntrustedFiles, LinksPlantedInTheRunFolderAreNeverWrittenThrough) {
  auto pg = single_group();
  const std::string outside = dir_ + "/outside", run_dir = dir_ + "/run";
  fs::create_directories(outside);
  fs::create_directories(run_dir);
  const std::string victim = outside + "/victim.txt";
  std::ofstream(victim) << "precious";
  for (const char* name : {"checkpoint.pt.tmp", "metrics.csv", "metrics.csv.tmp", "model.pt.tmp", "charts.gp.tmp"})
    fs::create_symlink(victim, run_dir + "/" + name);

  ddp::RunDir run(run_dir, *pg);
  run.start(0);
  run.record({1, 0.5, 0.4, 0.9, 100, 1});
  torch::nn::Linear net(3, 2);
  torch::optim::SGD opt(net->parameters(), 0.1);
  ddp::save_checkpoint(run.checkpoint_path(), *net, opt, ddp::TrainState{}, *pg);
  ddp::save_state_dict(*net, run.model_path());
  run.draw_charts();
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(run_dir + "/metrics.csv"));
  EXPECT_NE(slurp(run_dir + "/metrics.csv").find("1,0.5"), std::string::npos);
  EXPECT_EQ(ddp::load_checkpoint(run.checkpoint_path(), *net, &opt, *pg).epoch, 0);

  // Appending files: a link is an error naming it, not a write through it.
  fs::remove(run_dir + "/metrics.csv");
  fs::create_symlink(victim, run_dir + "/metrics.csv");
  EXPECT_NE(error_of([&] { run.record({2, 0.5, 0.4, 0.9, 100, 1}); }).find("metrics.csv"), std::string::npos);
  const std::string other = dir_ + "/run2";
  fs::create_directories(other);
  fs::create_symlink(victim, other + "/log.txt");
  EXPECT_NE(error_of([&] { ddp::RunDir again(other, *pg); }).find("log.txt"), std::string::npos);
  EXPECT_EQ(slurp(victim), "precious");
}

TEST_F(UntrustedFiles, AWriteIntoADeletedRunFolderSaysSo) {
  auto pg = single_group();
  const std::string run_dir = dir_ + "/gone";
  fs::create_directories(run_dir);
  torch::nn::Linear net(3, 2);
  torch::optim::SGD opt(net->parameters(), 0.1);
  fs::remove_all(run_dir);
  const auto err = error_of([&] { ddp::save_checkpoint(run_dir + "/checkpoint.pt", *net, opt, {}, *pg); });
  EXPECT_NE(err.find("no longer exists"), std::string::npos) << err;
  EXPECT_EQ(err.find("is untouched"), std::string::npos) << err;
}

// ---- 3. rotation never loses the last good checkpoint ----------------------

TEST_F(UntrustedFiles, AfterFallingBackAFailedSaveKeepsTheGoodPreviousCheckpoint) {
  auto pg = single_group();
  torch::nn::Linear net(3, 2);
  torch::optim::SGD opt(net->parameters(), 0.1);
  const std::string path = dir_ + "/checkpoint.pt", prev = dir_ + "/checkpoint.prev.pt";
  ddp::TrainState state;
  state.epoch = 1;
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  state.epoch = 2;
  ddp::save_checkpoint(path, *net, opt, state, *pg);
  std::string bytes = slurp(path);
  bytes[bytes.size() / 2] ^= 0x55;  // damaged after it was written
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  ::testing::internal::CaptureStdout();
  auto resumed = ddp::load_checkpoint(path, *net, &opt, *pg);
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(resumed.epoch, 1);
  EXPECT_EQ(resumed.last_checkpoint, prev) << "names the file it resumed from";

  // The next save fails (a folder stands where its temporary goes): both files stay as they were.
  fs::create_directories(path + ".tmp/x");
  resumed.epoch = 2;
  EXPECT_NE(error_of([&] { ddp::save_checkpoint(path, *net, opt, resumed, *pg); }), "");
  EXPECT_EQ(ddp::load_checkpoint(prev, *net, &opt, *pg).epoch, 1) << "the good previous checkpoint survives";
  EXPECT_EQ(slurp(path), bytes);

  // Once it can write, the damaged newest file is replaced, not kept as the previous one.
  fs::remove_all(path + ".tmp");
  ::testing::internal::CaptureStdout();
  ddp::save_checkpoint(path, *net, opt, resumed, *pg);
  const auto out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("is not kept as"), std::string::npos) << out;
  EXPECT_EQ(ddp::load_checkpoint(prev, *net, &opt, *pg).epoch, 1);
  EXPECT_EQ(ddp::load_checkpoint(path, *net, &opt, *pg).epoch, 2);
}

// ---- 6. a checkpoint's counts are range-checked ----------------------------

TEST_F(UntrustedFiles, CheckpointCountsOutsideTheirRangeAreRefused) {
  auto pg = single_group();
  torch::nn::Linear net(3, 2);
  torch::optim::SGD opt(net->parameters(), 0.1);
  const std::string path = dir_ + "/checkpoint.pt";
  for (int64_t epoch : {int64_t(-5), int64_t(1) << 62}) {
    ddp::TrainState state;
    state.epoch = epoch;
    ddp::save_checkpoint(path, *net, opt, state, *pg);
    const auto err = error_of([&] { ddp::load_checkpoint(path, *net, &opt, *pg); });
    EXPECT_NE(err.find("\"epoch\" is " + std::to_string(epoch)), std::string::npos) << err;
  }
}

// A TorchScript module's attributes of every kind come back as data
// (fuzz/corpus/module_archive_fuzz/py-jit-attrs.pt, fuzz/seeds/make_seeds.py).
TEST_F(UntrustedFiles, ATorchScriptModulesAttributesReadAsData) {
  auto archive = ddp::read_archive(std::string(FUZZ_CORPUS) + "/module_archive_fuzz/py-jit-attrs.pt");
  c10::IValue v;
  archive.read("ints", v);
  EXPECT_EQ(v.toIntVector(), (std::vector<int64_t>{1, 2, 3}));
  archive.read("tensors", v);
  ASSERT_EQ(v.toTensorVector().size(), 2u);
  EXPECT_TRUE(torch::equal(v.toTensorVector()[1], torch::ones({1})));
  archive.read("table", v);
  EXPECT_EQ(v.toGenericDict().at("lr").toDoubleVector(), (std::vector<double>{0.1, 0.01}));
  EXPECT_TRUE(v.toGenericDict().at("empty").toDoubleVector().empty());
  archive.read("pair", v);
  EXPECT_EQ(v.toTupleRef().elements()[1].toDouble(), 0.999);
  archive.read("maybe", v);
  EXPECT_TRUE(v.isNone());
  torch::Tensor weight, running;
  archive.read("weight", weight);
  EXPECT_TRUE(torch::equal(weight, torch::ones({3, 2})));
  torch::serialize::InputArchive inner;
  archive.read("inner", inner);
  inner.read("running", running, /*is_buffer=*/true);
  EXPECT_TRUE(torch::equal(running, torch::arange(3.)));
}
