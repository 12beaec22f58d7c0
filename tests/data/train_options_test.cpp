// The shared command line.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ddp/train/checkpoint.h"
#include "ddp/train/train_options.h"

namespace {

ddp::TrainOptions parse(std::vector<std::string> args, ddp::TrainOptions defaults = {}) {
  args.insert(args.begin(), "example");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ddp::parse_train_options(static_cast<int>(argv.size()), argv.data(), defaults);
}

}  // namespace

TEST(TrainOptions, DefaultsComeFromTheExample) {
  auto o = parse({}, ddp::TrainOptions().global_batch_size(256).lr(0.2));
  EXPECT_EQ(o.per_process_batch(2), 128);
  EXPECT_DOUBLE_EQ(o.lr(), 0.2);
  EXPECT_EQ(o.limit_batches(), -1);
  EXPECT_EQ(o.resume_path(), "");
}

TEST(TrainOptions, BatchSizePerProcessOrGlobal) {
  auto defaults = ddp::TrainOptions().global_batch_size(256);
  EXPECT_EQ(parse({"--batch-size", "32"}, defaults).per_process_batch(4), 32);
  EXPECT_EQ(parse({"--global-batch-size", "96"}, defaults).per_process_batch(3), 32);
  EXPECT_THROW(parse({"--global-batch-size", "100"}, defaults).per_process_batch(3), ddp::UsageError);
  EXPECT_THROW(parse({"--global-batch-size", "64", "--batch-size", "8"}, defaults), ddp::UsageError);
}

namespace {

// Sets the restart variables for a test's lifetime (and clears the others).
struct RestartEnv {
  explicit RestartEnv(const char* name = nullptr, const char* value = nullptr) {
    for (const char* n : kNames) ::unsetenv(n);
    if (name) ::setenv(name, value, 1);
  }
  ~RestartEnv() {
    for (const char* n : kNames) ::unsetenv(n);
  }
  static constexpr const char* kNames[] = {"DDPRUN_RDZV_ROUND", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"};
};

}  // namespace

TEST(TrainOptions, ARestartAtAWorldSizeThatDoesNotDivideTheGlobalBatchRoundsDownAndWarns) {
  auto o = parse({"--global-batch-size", "256"});
  {
    RestartEnv fresh;
    EXPECT_THROW(o.per_process_batch(3), ddp::UsageError) << "a fresh start keeps the rule";
    EXPECT_EQ(ddp::restart_reason(), "");
  }
  for (const char* name : RestartEnv::kNames) {
    RestartEnv restart(name, "2");
    EXPECT_EQ(ddp::restart_reason(), std::string(name) + "=2");
    ::testing::internal::CaptureStdout();
    EXPECT_EQ(o.per_process_batch(3), 85) << name;
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(out.find("global batch 255 = 3 x 85, not --global-batch-size 256: 3 ranks do not divide it"),
              std::string::npos) << out;
    EXPECT_NE(out.find("the learning rate is unchanged"), std::string::npos) << out;
    EXPECT_EQ(o.per_process_batch(4), 64) << "a world that divides it: no change";
    EXPECT_EQ(o.per_process_batch(300), 1) << "at least one sample per process";
  }
  {
    RestartEnv zero("DDPRUN_RDZV_ROUND", "0");
    EXPECT_EQ(ddp::restart_reason(), "") << "round 0 is the first start";
    EXPECT_THROW(o.per_process_batch(3), ddp::UsageError);
  }
  RestartEnv restart("DDPRUN_RDZV_ROUND", "1");
  EXPECT_EQ(parse({"--batch-size", "32"}).per_process_batch(3), 32) << "--batch-size stays per process";
}

TEST(TrainOptions, LimitBatchesCountsTheBatchesTakenBeforeAResume) {
  auto o = parse({"--limit-batches", "5"});
  EXPECT_EQ(o.steps_per_epoch(100, 8), 5);
  EXPECT_EQ(o.steps_per_epoch(100, 8, 3), 2);
  EXPECT_EQ(o.steps_per_epoch(100, 8, 5), 0);
  EXPECT_EQ(o.steps_per_epoch(12, 8, 3), 2);
  EXPECT_EQ(parse({}).steps_per_epoch(100, 8, 3), 13) << "no limit: what is left";
}

TEST(TrainOptions, AllCommonOptions) {
  auto o = parse({"--epochs", "3", "--lr", "0.5", "--seed", "9", "--backend", "gloo", "--bucket-cap-mb", "1.5",
                  "--data-dir", "/d", "--run-dir", "/r", "--checkpoint-every", "2", "--workers", "2",
                  "--limit-batches", "4", "--timeout", "60", "--batch-size", "8"});
  EXPECT_EQ(o.epochs(), 3);
  EXPECT_EQ(o.seed(), 9u);
  EXPECT_EQ(o.backend(), "gloo");
  EXPECT_DOUBLE_EQ(o.ddp_options().bucket_cap_mb(), 1.5);
  EXPECT_EQ(o.process_group_options().timeout(), std::chrono::seconds(60));
  EXPECT_EQ(o.data_dir(), "/d");
  EXPECT_EQ(o.workers(), 2);
  EXPECT_EQ(o.steps_per_epoch(100, 8), 4);
  EXPECT_EQ(o.steps_per_epoch(20, 8), 3);
  EXPECT_TRUE(o.checkpoint_due(2));
  EXPECT_FALSE(o.checkpoint_due(1));
  EXPECT_TRUE(o.checkpoint_due(3));  // the last epoch always
  EXPECT_EQ(o.to_config().at("lr"), "0.5");
}

TEST(TrainOptions, ResumeAloneMeansTheRunDirsCheckpoint) {
  EXPECT_EQ(parse({"--run-dir", "/nonexistent/run", "--resume"}).resume_path(), "/nonexistent/run/checkpoint.pt");
  EXPECT_EQ(parse({"--resume=/x/ck.pt"}).resume_path(), "/x/ck.pt");
  EXPECT_EQ(parse({"--resume", "/tmp"}).resume_path(), "/tmp/checkpoint.pt");
}

TEST(TrainOptions, BadValuesAreUsageErrors) {
  EXPECT_THROW(parse({"--epochs", "many"}), ddp::UsageError);
  EXPECT_THROW(parse({"--no-such-option"}), ddp::UsageError);
  EXPECT_THROW(parse({"--lr", "0"}), ddp::UsageError);
  // What the core options refuse is refused by the command line, before any process group.
  EXPECT_THROW(parse({"--bucket-cap-mb", "0"}), ddp::UsageError);
  EXPECT_THROW(parse({"--backend", "carrier-pigeon"}), ddp::UsageError);
}

TEST(TrainOptions, DefaultsAreTheCoreOptionsDefaults) {
  const ddp::TrainOptions o;
  EXPECT_DOUBLE_EQ(o.bucket_cap_mb(), ddp::DistributedDataParallelOptions().bucket_cap_mb());
  EXPECT_EQ(o.backend(), ddp::ProcessGroupOptions().backend());
  EXPECT_EQ(std::chrono::seconds(o.timeout_s()), ddp::ProcessGroupOptions().timeout());
}

TEST(TrainOptions, AmpIsASwitchRecordedInTheConfig) {
  EXPECT_FALSE(parse({}).amp());
  auto o = parse({"--amp"});
  EXPECT_TRUE(o.amp());
  EXPECT_EQ(o.to_config().at("amp"), "1");
  EXPECT_THROW(parse({"--amp", "yes"}), ddp::UsageError) << "a switch takes no value";
}
