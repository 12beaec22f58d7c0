// Faults a training run meets and what the examples do about them: a rank
// killed under `ddprun --max-restarts` (the restarted group resumes to the
// same parameters as an uninterrupted run), --resume auto on a fresh folder,
// non-finite options and losses, bad model options, and a disk that fills up
// while a checkpoint is written (root only: a small tmpfs).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../support/idx_fixture.h"
#include "../support/located.h"
#include "../support/multiprocess.h"
#include "ddp/train/state_dict.h"

namespace fs = std::filesystem;
using ddp::testing::describe;
using ddp::testing::run_ranks;

namespace {

class Faults : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ddp::testing::temp_dir("faults"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::vector<std::string> lenet_args(const std::string& run, const std::string& epochs) const {
    return {"--epochs", epochs, "--global-batch-size", "32", "--lr", "0.1", "--data-dir", dir_ + "/data",
            "--run-dir", run};
  }
  void expect_same_model(const std::string& a_path, const std::string& b_path) {
    auto a = ddp::read_state_dict(a_path), b = ddp::read_state_dict(b_path);
    ASSERT_EQ(a.size(), b.size());
    for (auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key() << " differs";
  }
  std::string dir_;
};

}  // namespace

// ddprun --max-restarts 1, a rank killed after the first
// checkpoint; the restarted workers resume from it by themselves and end
// bitwise equal to a run that was never interrupted. --resume auto makes the
// first attempt start fresh in an empty folder.
TEST_F(Faults, DdprunRestartAfterAKilledRankResumesToTheSameParametersAsOneRun) {
#ifndef DDPRUN_BIN
  GTEST_SKIP() << "ddprun is not built here (DDP_BUILD_LAUNCHER=OFF)";
#else
  ddp::testing::write_fashion_mnist(dir_ + "/data", 1024, 64);
  auto one = run_ranks(2, LENET_FMNIST, lenet_args(dir_ + "/one", "6"));
  for (auto& r : one) ASSERT_EQ(r.exit_code, 0) << describe(one);

  const std::string run = dir_ + "/two", ranks_dir = dir_ + "/ranks";
  fs::create_directories(ranks_dir);
  std::vector<std::string> args{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", LENET_FMNIST};
  for (const auto& a : lenet_args(run, "6")) args.push_back(a);
  args.push_back("--resume");
  args.push_back("auto");
  ddp::testing::RankResult job;
  std::thread launcher([&] {
    job = ddp::testing::run_program(DDPRUN_BIN, args, {{"DDP_TEST_DIR", ranks_dir}, {"OMP_NUM_THREADS", "1"}});
  });
  pid_t killed = 0;
  for (int i = 0; i < 12000 && !killed; ++i) {
    if (fs::exists(run + "/checkpoint/manifest.pt")) {
      killed = ddp::testing::find_rank_pid(ranks_dir, 1);
      if (killed) ::kill(killed, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  launcher.join();
  ASSERT_GT(killed, 0) << "rank 1 was never seen after the first checkpoint\n" << job.output;
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_NE(job.output.find("no checkpoint in " + run + " yet; starting fresh"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("restarting every worker, restart 1 of 1"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("resumed from " + run + "/checkpoint after epoch"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("(TORCHELASTIC_RESTART_COUNT=1"), std::string::npos) << job.output;
  expect_same_model(dir_ + "/one/model.pt", run + "/model.pt");
#endif
}

TEST_F(Faults, ResumeAutoStartsFreshWithoutACheckpointAndAMissingFileIsAnError) {
  ddp::testing::write_fashion_mnist(dir_ + "/data", 128, 64);
  for (const std::string& flag : {"--resume", "--resume=auto"}) {
    const std::string run = dir_ + "/fresh" + std::to_string(flag.size());
    auto args = lenet_args(run, "1");
    args.push_back(flag);
    auto results = run_ranks(2, LENET_FMNIST, args);
    for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
    EXPECT_NE(results[0].output.find("starting fresh"), std::string::npos) << results[0].output;
    // Now there is one: the same command resumes from it.
    args = lenet_args(run, "2");
    args.push_back(flag);
    results = run_ranks(2, LENET_FMNIST, args);
    EXPECT_NE(results[0].output.find("resumed from " + run + "/checkpoint after epoch 1"), std::string::npos)
        << results[0].output;
  }
  auto args = lenet_args(dir_ + "/named", "1");
  args.insert(args.end(), {"--resume", dir_ + "/no/such/checkpoint.pt"});
  auto results = run_ranks(2, LENET_FMNIST, args);
  for (int r = 0; r < 2; ++r) EXPECT_NE(results[r].exit_code, 0) << describe(results);
  EXPECT_NE(results[0].output.find("cannot resume: " + dir_ + "/no/such/checkpoint.pt"), std::string::npos)
      << results[0].output;
  EXPECT_NE(results[1].output.find("rank 0 failed to read the checkpoint"), std::string::npos) << results[1].output;
}

TEST_F(Faults, NonFiniteAndImpossibleOptionsAreRefusedBeforeTraining) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> lenet_cases = {
      {{"--lr", "inf"}, "--lr must be a finite number > 0"},
      {{"--lr", "nan"}, "--lr must be a finite number > 0"},
      {{"--lr", "-inf"}, "--lr must be a finite number > 0"},
      {{"--bucket-cap-mb", "inf"}, "--bucket-cap-mb must be a number"},
      {{"--nonfinite-loss", "ignore"}, "--nonfinite-loss must be stop or continue"}};
  for (const auto& [args, message] : lenet_cases) {
    auto results = run_ranks(1, LENET_FMNIST, args);
    EXPECT_EQ(results[0].exit_code, 2) << describe(results);
    EXPECT_NE(results[0].output.find(message), std::string::npos) << results[0].output;
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> informer_cases = {
      {{"--label-len", "200"}, "--label-len 200 must lie in 0..96 (--seq-len)"},
      {{"--d-model", "0"}, "--d-model must be at least 1"},
      {{"--d-model", "30"}, "--d-model 30 does not divide by --heads 4"},
      {{"--heads", "0"}, "--heads must be at least 1"},
      {{"--lr", "nan"}, "--lr must be a finite number > 0"}};
  for (auto [args, message] : informer_cases) {
    args.insert(args.end(), {"--run-dir", dir_ + "/informer"});
    auto results = run_ranks(1, INFORMER_CSV, args);
    EXPECT_EQ(results[0].exit_code, 2) << describe(results);
    EXPECT_NE(results[0].output.find(message), std::string::npos) << results[0].output;
  }
  // informer_make_csv: --help is help, not a file name.
  fs::current_path(dir_);
  auto help = ddp::testing::run_program(INFORMER_MAKE_CSV, {"--help"});
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("usage: informer_make_csv OUT.csv"), std::string::npos) << help.output;
  EXPECT_FALSE(fs::exists(dir_ + "/--help"));
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"--rows", "5"}, {dir_ + "/x.csv", "many"}, {dir_ + "/x.csv", "100", "0"}, {}}) {
    auto r = ddp::testing::run_program(INFORMER_MAKE_CSV, bad);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/x.csv"));
}

// A learning rate that makes LeNet diverge at its second step: both ranks
// stop with the error, exit 1, and no checkpoint of NaN weights is written.
TEST_F(Faults, ADivergingExampleStopsOnEveryRankWithTheStepAndNoCheckpoint) {
  ddp::testing::write_fashion_mnist(dir_ + "/data", 256, 64);
  auto args = lenet_args(dir_ + "/run", "2");
  args[5] = "1e20";
  auto results = run_ranks(2, LENET_FMNIST, args);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << describe(results);
    EXPECT_NE(results[r].output.find("rank " + std::to_string(r) + "/2: the training loss is"), std::string::npos)
        << results[r].output;
    EXPECT_NE(results[r].output.find("no checkpoint was written before it"), std::string::npos) << results[r].output;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/run/checkpoint"));
  EXPECT_FALSE(fs::exists(dir_ + "/run/checkpoint.pt"));
  // Told to continue, it trains on and exits 0.
  args[1] = "1";
  args.insert(args.end(), {"--nonfinite-loss", "continue"});
  results = run_ranks(2, LENET_FMNIST, args);
  for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  EXPECT_NE(results[0].output.find("training on (--nonfinite-loss continue)"), std::string::npos) << results[0].output;
}

// The disk fills while the second checkpoint is written: every rank fails
// with the reason, the first checkpoint stays byte for byte, nothing of the
// failed one is left, and once there is room the run resumes from it.
TEST_F(Faults, ADiskThatFillsDuringACheckpointKeepsThePreviousOneAndSaysWhy) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string mnt = dir_ + "/small";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  ddp::testing::write_fashion_mnist(dir_ + "/data", 128, 64);
  const std::string run = mnt + "/run";
  auto results = run_ranks(2, LENET_FMNIST, lenet_args(run, "1"));
  for (auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe(results);
  // The ranks share the folder: a sharded checkpoint, whose manifest names the save.
  const std::string first = ddp::testing::read_file(run + "/checkpoint/manifest.pt");
  ASSERT_GT(first.size(), 1000u);
  auto folder_entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(run + "/checkpoint"))
      names.push_back(e.path().lexically_relative(run).string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto entries = folder_entries();

  // Leave 64 KiB: room for the logs, not for a checkpoint.
  struct statvfs fsinfo {};
  ASSERT_EQ(::statvfs(mnt.c_str(), &fsinfo), 0);
  const uint64_t free_bytes = fsinfo.f_bavail * fsinfo.f_frsize;
  ASSERT_GT(free_bytes, 64u * 1024);
  {
    std::ofstream filler(mnt + "/filler", std::ios::binary);
    filler << std::string(free_bytes - 64 * 1024, '\0');
  }
  auto args = lenet_args(run, "2");
  args.push_back("--resume");
  results = run_ranks(2, LENET_FMNIST, args);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << describe(results);
    EXPECT_NE(results[r].output.find("rank " + std::to_string(r)), std::string::npos) << results[r].output;
  }
  EXPECT_NE(results[0].output.find("No space left on device"), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("the checkpoint before this one"), std::string::npos) << results[0].output;
  EXPECT_NE(results[1].output.find("rank 0 failed"), std::string::npos) << results[1].output;
  EXPECT_EQ(ddp::testing::read_file(run + "/checkpoint/manifest.pt"), first) << "the first checkpoint changed";
  EXPECT_EQ(folder_entries(), entries) << "a part of the failed checkpoint was left behind\n" << results[0].output;

  fs::remove(mnt + "/filler");
  results = run_ranks(2, LENET_FMNIST, args);
  for (auto& r : results) EXPECT_EQ(r.exit_code, 0) << describe(results);
  EXPECT_NE(results[0].output.find("resumed from " + run + "/checkpoint after epoch 1"), std::string::npos)
      << results[0].output;
}
