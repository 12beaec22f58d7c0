// The shared command line.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddp/train/checkpoint.h"
#include "ddp/train/train_options.h"
#include "../support/idx_fixture.h"

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

// A run folder may hold both layouts (its ranks shared it in one attempt,
// not in another): a resume takes the one written last.
TEST(TrainOptions, ARunFolderMeansItsNewestCheckpointTheFileOrTheShardedFolder) {
  namespace fs = std::filesystem;
  const std::string run = ddp::testing::temp_dir("newest");
  auto touch = [](const fs::path& p, int age_s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p).put('x');
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::seconds(age_s));
  };
  touch(run + "/checkpoint.prev.pt", 60);
  EXPECT_EQ(parse({"--resume", run}).resume_path(), run + "/checkpoint.pt");  // the file falls back to its .prev
  touch(run + "/checkpoint/manifest.prev.pt", 30);
  EXPECT_EQ(parse({"--resume", run}).resume_path(), run + "/checkpoint");
  EXPECT_EQ(parse({"--run-dir", run, "--resume"}).resume_path(), run + "/checkpoint");
  touch(run + "/checkpoint.pt", 10);
  EXPECT_EQ(parse({"--resume", run}).resume_path(), run + "/checkpoint.pt");
  touch(run + "/checkpoint/manifest.pt", 5);
  EXPECT_EQ(parse({"--run-dir", run, "--resume", "auto"}).resume_path(), run + "/checkpoint");
  // A sharded checkpoint's own folder is itself.
  EXPECT_EQ(parse({"--resume", run + "/checkpoint"}).resume_path(), run + "/checkpoint");
  fs::remove_all(run);
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
  EXPECT_THROW(parse({"--amp", "yes"}), ddp::UsageError) << "not a dtype";
}

// TensorBoard files are on unless --no-tensorboard; every program takes both
// switches, whatever kit options it declares.
TEST(TrainOptions, TensorBoardIsOnByDefaultAndEveryProgramTakesBothSwitches) {
  EXPECT_TRUE(parse({}).tensorboard());
  EXPECT_EQ(parse({}).to_config().at("tensorboard"), "1");
  EXPECT_TRUE(parse({"--tensorboard"}).tensorboard());
  EXPECT_FALSE(parse({"--no-tensorboard"}).tensorboard());
  EXPECT_EQ(parse({"--no-tensorboard"}).to_config().at("tensorboard"), "0");
  EXPECT_FALSE(parse({}, ddp::TrainOptions().tensorboard(false)).tensorboard()) << "a program's own default";
  EXPECT_THROW(parse({"--tensorboard", "--no-tensorboard"}), ddp::UsageError);
  const auto declared = ddp::TrainOptions().supports({"epochs"});
  EXPECT_FALSE(parse({"--no-tensorboard"}, declared).tensorboard());
}

// --amp [auto|fp16|bf16]: float16 with the loss scaler on GPUs, bfloat16
// without one; auto picks by device; float16 on a CPU is refused.
TEST(TrainOptions, AmpTakesADtype) {
  const torch::Device cpu(torch::kCPU), cuda(torch::kCUDA, 0);
  auto o = parse({"--amp"});
  EXPECT_EQ(o.amp_dtype(), "auto");
  EXPECT_EQ(o.autocast_dtype(cpu), torch::kBFloat16);
  EXPECT_EQ(o.autocast_dtype(cuda), torch::kHalf);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--amp", "bf16"}, {"--amp=bfloat16"},
                                                {"--amp", "bf16", "--epochs", "2"}}) {
    o = parse(args);
    EXPECT_TRUE(o.amp());
    EXPECT_EQ(o.amp_dtype(), "bf16");
    EXPECT_EQ(o.autocast_dtype(cuda), torch::kBFloat16);
    EXPECT_EQ(o.to_config().at("amp_dtype"), "bf16");
  }
  o = parse({"--amp", "fp16"});
  EXPECT_EQ(o.autocast_dtype(cuda), torch::kHalf);
  EXPECT_THROW(o.autocast_dtype(cpu), ddp::UsageError);
  EXPECT_FALSE(parse({"--epochs", "2"}).amp());
  EXPECT_THROW(parse({"--amp", "int8"}), ddp::UsageError);
}

namespace {

// What --help prints (parse exits 0 there): run in a child, its stdout read back.
std::string help_text(const ddp::TrainOptions& defaults) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    try {
      parse({"--help"}, defaults);
    } catch (...) {
    }
    ::_exit(3);  // parse returned: --help did not exit
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t k; (k = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(k));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out = "EXIT " + std::to_string(status) + ": " + out;
  return out;
}

ddp::TrainOptions charlm() {
  return ddp::TrainOptions()
      .lr(0.003)
      .add_option("dim", 256, "embedding width")
      .add_option("dropout", 0.1, "dropout probability")
      .add_option("corpus", "tiny.txt", "the text to learn")
      .add_option("sample", false, "print a sample after each epoch", ddp::OnResume::may_change);
}

}  // namespace

TEST(TrainOptions, ProgramOptionsAreParsedTypedAndRecorded) {
  auto o = parse({}, charlm());
  EXPECT_EQ(o.get<int64_t>("dim"), 256);
  EXPECT_EQ(o.get<double>("dropout"), 0.1);
  EXPECT_EQ(o.get<std::string>("corpus"), "tiny.txt");
  EXPECT_FALSE(o.get<bool>("sample"));
  o = parse({"--dim", "512", "--dropout", "0.25", "--corpus=shakespeare.txt", "--sample"}, charlm());
  EXPECT_EQ(o.get<int64_t>("dim"), 512);
  EXPECT_EQ(o.get<double>("dropout"), 0.25);
  EXPECT_EQ(o.get<std::string>("corpus"), "shakespeare.txt");
  EXPECT_TRUE(o.get<bool>("sample"));
  const auto config = o.to_config();
  EXPECT_EQ(config.at("dim"), "512");
  EXPECT_EQ(config.at("dropout"), "0.25");
  EXPECT_EQ(config.at("corpus"), "shakespeare.txt");
  EXPECT_EQ(config.at("sample"), "1");
  EXPECT_EQ(config.at("lr"), "0.003");
  EXPECT_EQ(parse({"--lr", "0.0001234567891"}).to_config().at("lr"), "0.0001234567891") << "recorded exactly";

  EXPECT_THROW(o.get<double>("dim"), ddp::UsageError) << "an int read as a float";
  EXPECT_THROW(o.get<int64_t>("heads"), ddp::UsageError) << "not registered";
  EXPECT_THROW(parse({"--dim", "wide"}, charlm()), ddp::UsageError);
  EXPECT_THROW(parse({"--dropout", "nan"}, charlm()), ddp::UsageError);
  EXPECT_THROW(parse({"--sample", "yes"}, charlm()), ddp::UsageError) << "a switch takes no value";
}

TEST(TrainOptions, ProgramOptionNamesAreCheckedWhereTheyAreMade) {
  EXPECT_THROW(ddp::TrainOptions().add_option("lr", 0.1, "mine"), ddp::UsageError) << "the kit's option";
  EXPECT_THROW(ddp::TrainOptions().add_option("timeout-s", 1, "mine"), ddp::UsageError) << "the kit's config key";
  EXPECT_THROW(ddp::TrainOptions().add_option("Dim", 1, "x"), ddp::UsageError);
  EXPECT_THROW(ddp::TrainOptions().add_option("", 1, "x"), ddp::UsageError);
  EXPECT_THROW(ddp::TrainOptions().add_option("dim", 1, "x").add_option("dim", 2, "y"), ddp::UsageError);
  EXPECT_THROW(ddp::TrainOptions().add_option("sync", true, "x"), ddp::UsageError) << "a switch is off by default";
  EXPECT_EQ(parse({"--seq-len", "64"}, ddp::TrainOptions().add_option("--seq-len", 128, "x")).get<int64_t>("seq-len"),
            64) << "argparse's spelling";
  EXPECT_THROW(ddp::TrainOptions().supports({"epochs", "ampp"}), ddp::UsageError);
}

TEST(TrainOptions, KitOptionsAProgramDoesNotDeclareAreUnknown) {
  const auto defaults = charlm().supports({"epochs", "batch-size", "lr", "run-dir", "resume"});
  EXPECT_EQ(parse({"--epochs", "3", "--lr", "0.01", "--dim", "8"}, defaults).epochs(), 3);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--amp"}, {"--data-dir", "/d"}, {"--workers", "2"}}) {
    try {
      parse(args, defaults);
      ADD_FAILURE() << args[0] << " accepted";
    } catch (const ddp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("unrecognised option '" + args[0] + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(parse({"--amp", "--data-dir", "/d"}, charlm()).amp()) << "no declaration: every kit option, as before";
}

TEST(TrainOptions, HelpListsWhatTheProgramTakesWithShortestDefaults) {
  const auto all = help_text(charlm().bucket_cap_mb(2.5));
  EXPECT_NE(all.find("--lr arg (=0.003)"), std::string::npos) << all;
  EXPECT_EQ(all.find("0.0030000000000000001"), std::string::npos) << all;
  EXPECT_NE(all.find("--bucket-cap-mb arg (=2.5)"), std::string::npos) << all;
  EXPECT_NE(all.find("example options"), std::string::npos) << all;  // argv[0] names the group
  EXPECT_NE(all.find("--dim arg (=256)"), std::string::npos) << all;
  EXPECT_NE(all.find("embedding width"), std::string::npos) << all;
  EXPECT_NE(all.find("--dropout arg (=0.1)"), std::string::npos) << all;
  EXPECT_NE(all.find("--corpus arg (=tiny.txt)"), std::string::npos) << all;
  EXPECT_NE(all.find("--sample "), std::string::npos) << all;
  EXPECT_NE(all.find("--amp"), std::string::npos) << all;

  const auto some = help_text(charlm().supports({"epochs", "lr"}));
  EXPECT_NE(some.find("--epochs"), std::string::npos) << some;
  EXPECT_NE(some.find("--lr arg (=0.003)"), std::string::npos) << some;
  EXPECT_NE(some.find("--dim arg (=256)"), std::string::npos) << some;
  for (const char* gone : {"--amp", "--data-dir", "--workers", "--bucket-cap-mb"})
    EXPECT_EQ(some.find(gone), std::string::npos) << gone << " is not the program's:\n" << some;
}
