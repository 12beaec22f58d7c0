// Error files: every worker's TORCHELASTIC_ERROR_FILE, what guarded_main
// records there, and ddprun's summary of it, hostile files included.
#include <regex>
#include <set>

#include "../support/located.h"
#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;

// The fields of an error file as Python's json module (torchrun's reader)
// reads them; empty without /usr/bin/python3.
std::string json_fields(const std::string& file, const std::string& dir) {
  if (::access("/usr/bin/python3", X_OK) != 0) return "";
  return Process({"/usr/bin/python3", "-c",
                  "import json, sys; m = json.load(open(sys.argv[1]))['message']; print(m['message']); "
                  "print(sorted(m['extraInfo']), int(m['extraInfo']['timestamp']) > 1600000000)",
                  file},
                 {}, dir)
      .wait(60)
      .out;
}

TEST_F(Launcher, EveryWorkerGetsAnErrorFileOfItsOwn) {
  std::string envs = sub("env"), tmp = sub("tmp");
  Result r = run({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())}, {"--env-dir", envs},
                 {{"TMPDIR", tmp}, {"TORCHELASTIC_ERROR_FILE", dir_ + "/mine.json"}});
  ASSERT_EQ(r.code, 0) << r.err;
  // torchrun replaces the variable per worker; so does ddprun, and says so.
  EXPECT_NE(r.err.find("TORCHELASTIC_ERROR_FILE=" + dir_ + "/mine.json is replaced"), std::string::npos) << r.err;
  std::set<std::string> files;
  for (int rank = 0; rank < 2; ++rank) {
    std::string f = read_env_file(env_path(envs, rank, 0))["TORCHELASTIC_ERROR_FILE"];
    EXPECT_EQ(f.rfind(tmp + "/ddprun_errors_", 0), 0u) << f;
    std::string tail = "/attempt_0/" + std::to_string(rank) + "/error.json";
    EXPECT_EQ(f.substr(f.size() - std::min(f.size(), tail.size())), tail) << f;
    files.insert(f);
  }
  EXPECT_EQ(files.size(), 2u);
  EXPECT_TRUE(fs::is_empty(tmp)) << "ddprun left its private error directory behind";

  // With log files, the error files sit beside them.
  std::string logs = dir_ + "/logs";
  Result l = run({"--master-port", std::to_string(free_port()), "--log-dir", logs}, {"--env-dir", envs});
  ASSERT_EQ(l.code, 0) << l.err;
  std::string f = read_env_file(env_path(envs, 0, 0))["TORCHELASTIC_ERROR_FILE"];
  EXPECT_EQ(f.rfind(logs + "/none_", 0), 0u) << f;
  EXPECT_TRUE(fs::exists(fs::path(f).parent_path() / "stdout.log")) << f;
}

TEST_F(Launcher, SummaryShowsTheErrorAGuardedWorkerRecorded) {
  std::string logs = dir_ + "/logs";
  Result r = Process({DDPRUN_BIN, "--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--log-dir",
                      logs, "--term-timeout", "5", GUARDED_WORKER_BIN, "1"},
                     {}, dir_)
                 .wait();
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string message =
      "ddp::CommError: rank 1: allreduce of bucket 0 timed out after 30 s (\"gloo\", peer rank 0); check the network";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("Root Cause[^\n]*\n([\\s\\S]*)Other Failures"))) << r.err;
  std::string root = m[1];
  EXPECT_NE(root.find("rank      : 1 (local_rank: 1)"), std::string::npos) << root;
  EXPECT_NE(root.find("traceback : " + message + "\n"), std::string::npos) << root;
  ASSERT_TRUE(std::regex_search(root, m, std::regex("error_file: (\\S+/attempt_0/1/error.json)\n"))) << root;
  std::string file = m[1];
  EXPECT_EQ(file.rfind(logs + "/", 0), 0u) << file;
  std::string fields = json_fields(file, dir_);
  if (fields.empty()) GTEST_SKIP() << "no /usr/bin/python3 to read the error file with json.load";
  EXPECT_EQ(fields, message + "\n['py_callstack', 'timestamp'] True\n");
}

// A libddp program that refuses its settings (exit 2 with a ddp::UsageError,
// as guarded_main records it) is not restarted: a restart with the same
// settings would refuse them again. Exit 2 for anything else is a failure
// like another, restarted as torchrun restarts any.
TEST_F(Launcher, RefusedSettingsAreNotRestarted) {
  struct Case {
    std::string error;
    bool restarted;
  };
  const std::vector<Case> cases{
      {"ddp::UsageError: rank 0: --global-batch-size 256 does not divide by the 3 processes", false},
      {"ddp::CommError: rank 0: allreduce of bucket 0 timed out after 30 s", true},
      {"", true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.error);
    const std::string envs = sub("env" + std::to_string(c.restarted) + std::to_string(c.error.size()));
    std::vector<std::string> worker{"--env-dir", envs, "--fail-rank", "0", "--exit", "2"};
    if (!c.error.empty())
      worker.insert(worker.end(), {"--error-json", R"({"message": {"message": ")" + c.error + R"("}})"});
    Result r = run({"--master-port", std::to_string(free_port()), "--max-restarts", "1"}, worker);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(fs::exists(env_path(envs, 0, 1)), c.restarted) << r.err;
    EXPECT_EQ(r.err.find("worker refused its settings (exit code 2, ddp::UsageError); not restarting") !=
                  std::string::npos,
              !c.restarted)
        << r.err;
  }
}

TEST_F(Launcher, GarbageOrHostileErrorFilesLeaveTheSummaryAsItWas) {
  struct Case {
    std::vector<std::string> worker;
    std::string shown;
  };
  const std::vector<Case> cases{
      {{"--error-json", "{\"message\": {\"message\": \"cut short"}, "not an error record in torchrun's JSON shape"},
      {{"--error-bytes", std::to_string(2 << 20)}, "larger than"},
      {{"--error-fifo"}, "not a regular file"},
      {{"--error-json", R"({"message": {"message": "RuntimeError: \u001b[31mred\u001b[0m"}})"},
       "traceback : RuntimeError: ?[31mred?[0m\n"}};
  for (const auto& c : cases) {
    std::vector<std::string> worker{"--fail-rank", "0", "--exit", "5"};
    worker.insert(worker.end(), c.worker.begin(), c.worker.end());
    Result r = run({"--master-port", std::to_string(free_port())}, worker);
    SCOPED_TRACE(c.worker[0]);
    EXPECT_EQ(r.code, 5) << r.err;
    EXPECT_NE(r.err.find("Root Cause"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("exitcode  : 5"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.shown), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "an escape sequence reached the console";
  }
}

}  // namespace
}  // namespace ddprun_test
