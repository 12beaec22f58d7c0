// End-to-end tests of ddprun: real launchers, real workers (test_worker),
// real signals and sockets. No timing assertions: timeouts only stop hangs.
#include <regex>
#include <set>

#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;

void expect_one_error_line(const Result& r, int code, const std::string& needle);

std::string env_path(const std::string& dir, int rank, int restart) {
  return dir + "/env." + std::to_string(rank) + "." + std::to_string(restart);
}

// ---------------------------------------------------------------- environment

TEST_F(Launcher, EveryWorkerGetsTorchrunsEnvironment) {
  std::string envs = sub("env");
  uint16_t port = free_port();
  Result r = run({"--nproc-per-node", "3", "--master-port", std::to_string(port), "--rdzv-id", "myrun"},
                 {"--env-dir", envs});
  ASSERT_EQ(r.code, 0) << r.err;
  int omp = std::max(1, usable_cpus() / 3);
  for (int rank = 0; rank < 3; ++rank) {
    auto env = read_env_file(env_path(envs, rank, 0));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_NAME"], "default");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(port));
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "myrun");
    EXPECT_EQ(env["OMP_NUM_THREADS"], std::to_string(omp));
  }
  EXPECT_EQ(count_of(r.err, "setting OMP_NUM_THREADS=" + std::to_string(omp)), 1) << r.err;
}

TEST_F(Launcher, KeepsOmpNumThreadsAndReadsUnderscoreFlagsAndPetVariables) {
  std::string envs = sub("env");
  uint16_t port = free_port();
  Result r = run({"--nproc_per_node=2", "--master_port", std::to_string(port)}, {"--env-dir", envs},
                 {{"OMP_NUM_THREADS", "5"}, {"PET_MAX_RESTARTS", "4"}, {"PET_NPROC_PER_NODE", "7"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("OMP_NUM_THREADS"), std::string::npos) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    auto env = read_env_file(env_path(envs, rank, 0));
    EXPECT_EQ(env["OMP_NUM_THREADS"], "5");
    EXPECT_EQ(env["WORLD_SIZE"], "2");  // the command line beats PET_NPROC_PER_NODE
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "4");
  }
}

TEST_F(Launcher, StandaloneUsesLoopbackAndAFreePort) {
  std::string envs = sub("env");
  Result r = run({"--standalone", "--nproc-per-node", "2"}, {"--env-dir", envs});
  ASSERT_EQ(r.code, 0) << r.err;
  auto e0 = read_env_file(env_path(envs, 0, 0));
  auto e1 = read_env_file(env_path(envs, 1, 0));
  EXPECT_EQ(e0["MASTER_ADDR"], "127.0.0.1");
  EXPECT_GT(std::atoi(e0["MASTER_PORT"].c_str()), 0);
  EXPECT_EQ(e0["MASTER_PORT"], e1["MASTER_PORT"]);
  EXPECT_NE(e0["TORCHELASTIC_RUN_ID"], "none");
  EXPECT_EQ(e0["TORCHELASTIC_RUN_ID"], e1["TORCHELASTIC_RUN_ID"]);
}

TEST_F(Launcher, AutoWithoutGpuStartsOneWorkerPerCpu) {
  std::string envs = sub("env");
  // An empty CUDA_VISIBLE_DEVICES hides every GPU, so this holds on GPU hosts too.
  Result r = run({"--nproc-per-node", "auto", "--master-port", std::to_string(free_port())}, {"--env-dir", envs},
                 {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(r.code, 0) << r.err;
  int cpus = usable_cpus();
  EXPECT_EQ(count_files(envs, "env."), cpus);
  EXPECT_EQ(read_env_file(env_path(envs, 0, 0))["WORLD_SIZE"], std::to_string(cpus));

  Result gpu = run({"--nproc-per-node", "gpu"}, {}, {{"CUDA_VISIBLE_DEVICES", ""}});
  EXPECT_EQ(gpu.code, 1) << gpu.err;
  EXPECT_NE(gpu.err.find("no visible GPU"), std::string::npos) << gpu.err;
}

TEST_F(Launcher, SlurmVariablesProvideDefaults) {
  std::string envs = sub("env");
  uint16_t port = free_port();
  Env slurm0{{"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "localhost,nosuchhost[1-3]"}};
  Env slurm1 = slurm0;
  slurm1["SLURM_NODEID"] = "1";
  auto n1 = start({"--master-port", std::to_string(port)}, {"--env-dir", envs}, slurm1);
  auto n0 = start({"--master-port", std::to_string(port)}, {"--env-dir", envs}, slurm0);
  Result r0 = n0->wait(), r1 = n1->wait();
  ASSERT_EQ(r0.code, 0) << r0.err;
  ASSERT_EQ(r1.code, 0) << r1.err;
  EXPECT_NE(r1.err.find("--node-rank 1 (SLURM_NODEID)"), std::string::npos) << r1.err;
  for (int rank = 0; rank < 2; ++rank) {
    auto env = read_env_file(env_path(envs, rank, 0));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank));
    EXPECT_EQ(env["MASTER_ADDR"], "localhost");
  }
  // Explicit flags win over Slurm's variables.
  std::string envs2 = sub("env2");
  Result single = run({"--nnodes", "1", "--node-rank", "0", "--master-port", std::to_string(free_port())},
                      {"--env-dir", envs2}, slurm1);
  ASSERT_EQ(single.code, 0) << single.err;
  EXPECT_EQ(read_env_file(env_path(envs2, 0, 0))["WORLD_SIZE"], "1");
}

// `srun -n 2 ddprun ...` on one node: both ddpruns stop at once with a usage
// error (no workers, no rendezvous), instead of meeting on one port.
TEST_F(Launcher, TwoDdprunsOfOneSlurmStepOnANodeBothRefuse) {
  std::string pids = sub("pids");
  Env task{{"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "1"},
           {"SLURM_JOB_NODELIST", "localhost"}, {"SLURM_STEP_NODELIST", "localhost"},
           {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_NTASKS", "2"}};
  std::vector<std::unique_ptr<Process>> tasks;
  for (int local = 0; local < 2; ++local) {
    Env e = task;
    e["SLURM_LOCALID"] = std::to_string(local);
    e["SLURM_PROCID"] = std::to_string(local);
    tasks.push_back(start({"--nproc-per-node", "2"}, {"--pid-dir", pids, "--sleep", "-1"}, e));
  }
  for (auto& t : tasks) {
    Result r = t->wait(60);
    EXPECT_EQ(r.code, 2) << r.err;
    auto lines = lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("ddprun: error: Slurm step 4242.0 runs 2 tasks on node 0", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find("srun --ntasks-per-node=1 ddprun"), std::string::npos) << lines[0];
  }
  EXPECT_EQ(count_files(pids, "pid."), 0) << "a worker started";

  // One task per node in the same step runs as before.
  Env one = task;
  one["SLURM_STEP_TASKS_PER_NODE"] = "1";
  one["SLURM_NTASKS"] = "1";
  one["SLURM_LOCALID"] = "0";
  Result ok = run({"--nproc-per-node", "1", "--master-port", std::to_string(free_port())}, {}, one);
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// ----------------------------------------------------------- Python programs

bool system_python_has_torch(const std::string& dir) {
  if (::access("/usr/bin/python3", X_OK) != 0) return false;
  return Process({"/usr/bin/python3", "-c", "import torch"}, {}, dir).wait(120).code == 0;
}

// A python3 without torch first on PATH (a pyenv shim, a virtual
// environment): the script runs with the next candidate that has torch.
class PythonLauncher : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    bin_ = sub("bin");
    fake_ = bin_ + "/python3";
    std::ofstream(fake_) << "#!/bin/sh\nif [ \"$1\" = -c ]; then\n  echo \"ModuleNotFoundError: No module named "
                            "'torch'\" >&2\n  exit 1\nfi\necho fake python \"$@\"\n";
    fs::permissions(fake_, fs::perms::owner_all);
    script_ = dir_ + "/which_python.py";
    std::ofstream(script_) << "import os, sys, torch\nprint('interpreter', sys.executable, 'rank', os.environ['RANK'])\n";
    const char* path = std::getenv("PATH");
    path_ = bin_ + ":" + (path ? path : "/usr/bin:/bin");
  }
  std::string bin_, fake_, script_, path_;
};

TEST_F(PythonLauncher, ScriptRunsWithAnInterpreterThatHasTorch) {
  if (!system_python_has_torch(dir_)) GTEST_SKIP() << "/usr/bin/python3 cannot import torch on this machine";
  std::string port = std::to_string(free_port());
  Result r = Process({DDPRUN_BIN, "--nproc-per-node", "2", "--master-port", port, script_}, {{"PATH", path_}}, dir_)
                 .wait();
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "interpreter /usr/bin/python3 rank"), 2) << r.out;
  EXPECT_NE(r.err.find("running the Python script with /usr/bin/python3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("python3 on PATH (" + fake_ + "): exit code 1: ModuleNotFoundError"), std::string::npos)
      << r.err;

  // --module looks the same way.
  std::ofstream(dir_ + "/which_module.py") << "import sys, torch\nprint('module under', sys.executable)\n";
  Result m = Process({DDPRUN_BIN, "--master-port", port, "-m", "which_module"},
                     {{"PATH", path_}, {"PYTHONPATH", dir_}}, dir_)
                 .wait();
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_NE(m.out.find("module under /usr/bin/python3"), std::string::npos) << m.out;

  // PYTHON_EXEC wins unasked, as in torchrun; --no-python runs the script itself.
  Result exec = Process({DDPRUN_BIN, "--master-port", port, script_}, {{"PATH", path_}, {"PYTHON_EXEC", fake_}}, dir_)
                    .wait();
  ASSERT_EQ(exec.code, 0) << exec.err;
  EXPECT_NE(exec.out.find("fake python -u " + script_), std::string::npos) << exec.out;
  EXPECT_EQ(exec.err.find("running the Python script with"), std::string::npos) << exec.err;
}

// torchrun's own writer (@record) and ddprun's reader agree on the shape.
TEST_F(PythonLauncher, ARecordedPythonErrorShowsItsTracebackInTheSummary) {
  if (!system_python_has_torch(dir_)) GTEST_SKIP() << "/usr/bin/python3 cannot import torch on this machine";
  std::string script = dir_ + "/recorded.py";
  std::ofstream(script) << "from torch.distributed.elastic.multiprocessing.errors import record\n"
                           "@record\ndef main():\n    raise ValueError('bad batch size')\nmain()\n";
  Result r = Process({DDPRUN_BIN, "--master-port", std::to_string(free_port()), script},
                     {{"PYTHON_EXEC", "/usr/bin/python3"}}, dir_)
                 .wait();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("  traceback : Traceback (most recent call last):\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n    ValueError: bad batch size\n"), std::string::npos) << r.err;
}

TEST_F(PythonLauncher, NoInterpreterWithTorchIsAnErrorNamingEachOneTried) {
  if (system_python_has_torch(dir_))
    GTEST_SKIP() << "/usr/bin/python3 has torch here (ddprun_unit_tests' PythonChoiceTest covers this case)";
  Result r = Process({DDPRUN_BIN, script_}, {{"PATH", bin_ + ":/nonexistent"}}, dir_).wait();
  expect_one_error_line(r, 1, "python3 on PATH (" + fake_ + "): exit code 1: ModuleNotFoundError");
  EXPECT_NE(r.err.find("PYTHON_EXEC=/path/to/python3"), std::string::npos) << r.err;
}

// ------------------------------------------------------------- error files

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

// --------------------------------------------------------------------- output

TEST_F(Launcher, PrefixesWholeLinesWithTheRank) {
  const int kLines = 300, kWidth = 3000, kWorkers = 3;
  Result r = run({"--nproc-per-node", std::to_string(kWorkers), "--master-port", std::to_string(free_port())},
                 {"--lines", std::to_string(kLines), "--width", std::to_string(kWidth), "--partial"});
  ASSERT_EQ(r.code, 0) << r.err.substr(0, 2000);
  for (const std::string stream : {"out", "err"}) {
    const std::string& text = stream == "out" ? r.out : r.err;
    std::vector<int> next(kWorkers, 0);
    std::vector<bool> partial(kWorkers, false);
    std::regex line_re("\\[rank([0-9]+)\\]: rank=([0-9]+) stream=" + stream + " i=([0-9]+) (x*)");
    std::regex partial_re("\\[rank([0-9]+)\\]: rank=([0-9]+) stream=" + stream + " partial");
    for (const auto& line : lines_of(text)) {
      if (line.rfind("ddprun: ", 0) == 0) continue;
      std::smatch m;
      if (std::regex_match(line, m, partial_re)) {
        ASSERT_EQ(m[1], m[2]);
        partial[std::stoi(m[1])] = true;
        continue;
      }
      ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mangled line: " << line.substr(0, 200);
      int rank = std::stoi(m[1]);
      ASSERT_EQ(m[1], m[2]) << "a line carries another worker's prefix";
      ASSERT_EQ(std::stoi(m[3]), next[rank]) << "lines of rank " << rank << " out of order or missing";
      ASSERT_EQ(line.size() - (std::string("[rank") + m[1].str() + "]: ").size(), static_cast<size_t>(kWidth));
      ++next[rank];
    }
    for (int rank = 0; rank < kWorkers; ++rank) {
      EXPECT_EQ(next[rank], kLines) << stream << " of rank " << rank;
      EXPECT_TRUE(partial[rank]) << "the unterminated last line of rank " << rank << " on std" << stream;
    }
  }
}

TEST_F(Launcher, LogDirTeeRedirectsAndLocalRanksFilter) {
  std::string logs = dir_ + "/logs";  // created by ddprun
  Result r = run({"--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--log-dir", logs,
                  "--redirects", "1", "--local-ranks-filter", "1", "--rdzv-id", "job7"},
                 {"--lines", "5", "--width", "40"});
  ASSERT_EQ(r.code, 0) << r.err;
  // stdout went to the files only; stderr of local rank 1 only on the console.
  EXPECT_EQ(r.out.find("[rank"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.err, "[rank1]: "), 5) << r.err;
  EXPECT_EQ(count_of(r.err, "[rank0]: "), 0) << r.err;
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(logs)) runs.push_back(e.path());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].filename().string().rfind("job7_", 0), 0u) << runs[0];
  for (int lr = 0; lr < 2; ++lr)
    for (const std::string stream : {"out", "err"}) {
      std::string file = (runs[0] / "attempt_0" / std::to_string(lr) / ("std" + stream + ".log")).string();
      auto lines = lines_of(read_file(file));
      ASSERT_EQ(lines.size(), 5u) << file;
      EXPECT_EQ(lines[0].rfind("rank=" + std::to_string(lr) + " stream=" + stream + " i=0 ", 0), 0u) << lines[0];
    }

  // --tee without --log-dir: files in a fresh temporary directory, console too.
  Result t = run({"--nproc-per-node", "1", "--master-port", std::to_string(free_port()), "--tee", "3"},
                 {"--lines", "2", "--width", "20"}, {{"TMPDIR", dir_}});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(count_of(t.out, "[rank0]: rank=0 stream=out"), 2) << t.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(t.err, m, std::regex("worker logs in (\\S+)"))) << t.err;
  EXPECT_EQ(lines_of(read_file(m[1].str() + "/attempt_0/0/stdout.log")).size(), 2u);
}

// ------------------------------------------------------------------- teardown

TEST_F(Launcher, FailureStopsEveryWorkerAndGrandchildWithTheExitCode) {
  std::string pids = sub("pids");
  Result r = run({"--nproc-per-node", "3", "--master-port", std::to_string(free_port()), "--term-timeout", "20"},
                 {"--pid-dir", pids, "--grandchild", "--escapee", "--fail-rank", "1", "--exit", "7", "--wait-all",
                  "--sleep", "-1"});
  EXPECT_EQ(r.code, 7) << r.err;
  EXPECT_NE(r.err.find("rank      : 1 (local_rank: 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exitcode  : 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root Cause"), std::string::npos) << r.err;
  std::vector<pid_t> all;
  for (const char* kind : {"pid.", "gc.", "esc."}) {
    auto p = pids_in(pids, kind);
    EXPECT_EQ(p.size(), 3u) << kind;
    all.insert(all.end(), p.begin(), p.end());
  }
  for (pid_t p : all) EXPECT_FALSE(alive(p)) << "pid " << p << " survived ddprun";
}

TEST_F(Launcher, DeathBySignalIsReportedAs128PlusSignal) {
  Result r = run({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())},
                 {"--fail-rank", "0", "--signal-self", "9", "--sleep", "-1"});
  EXPECT_EQ(r.code, 128 + 9) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
}

TEST_F(Launcher, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  std::string pids = sub("pids");
  Result r = run({"--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--term-timeout", "1"},
                 {"--pid-dir", pids, "--ignore-term", "--fail-rank", "0", "--exit", "3", "--wait-all", "--sleep",
                  "-1"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
  for (pid_t p : pids_in(pids, "pid.")) EXPECT_FALSE(alive(p));
}

class Forwarding : public LauncherTest, public ::testing::WithParamInterface<int> {};

TEST_P(Forwarding, SignalToDdprunReachesEveryWorker) {
  int sig = GetParam();
  std::string pids = sub("pids"), traps = sub("traps");
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())},
                 {"--pid-dir", pids, "--trap-dir", traps, "--grandchild", "--sleep", "-1"});
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << p->current_err();
  p->signal(sig);
  Result r = p->wait();
  EXPECT_EQ(r.code, 128 + sig) << r.err;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(std::atoi(read_file(traps + "/sig." + std::to_string(rank)).c_str()), sig) << "rank " << rank;
  for (const char* kind : {"pid.", "gc."})
    for (pid_t q : pids_in(pids, kind)) EXPECT_FALSE(alive(q)) << kind << q;
}

// A warning (SIGUSR1/SIGUSR2) is forwarded, and ddprun goes on supervising:
// workers that take it in their stride finish their work, and ddprun exits
// with their status, not 128+signal, and kills nothing after --term-timeout.
TEST_F(LauncherTest, AWarningSignalIsForwardedAndTheWorkersGoOn) {
  std::string pids = sub("pids"), traps = sub("traps"), until = dir_ + "/until";
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--term-timeout", "1"},
                 {"--pid-dir", pids, "--trap-dir", traps, "--on-warning", "continue", "--until-file", until});
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << p->current_err();
  p->signal(SIGUSR1);
  ASSERT_TRUE(wait_for([&] { return count_files(traps, "warn.") == 2; })) << p->current_err();
  // Past --term-timeout: a stop request would have killed them by now.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  for (pid_t q : pids_in(pids, "pid.")) EXPECT_TRUE(alive(q)) << "worker " << q << " was stopped";
  std::ofstream(until) << "go";
  Result r = p->wait();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("received SIGUSR1; forwarding it to the workers"), std::string::npos) << r.err;
}

// Workers that checkpoint on the warning and exit 75 (ddp::kPreemptedExitCode)
// end the group with 75, which the job templates requeue on; --max-restarts
// does not restart them (Slurm would stop the restart anyway).
TEST_F(LauncherTest, WorkersStoppedForPreemptionAreNotRestartedAndGive75) {
  std::string pids = sub("pids"), traps = sub("traps"), envs = sub("envs");
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--max-restarts", "2"},
                 {"--pid-dir", pids, "--env-dir", envs, "--trap-dir", traps, "--on-warning", "75", "--sleep", "-1"});
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << p->current_err();
  p->signal(SIGUSR1);
  Result r = p->wait();
  EXPECT_EQ(r.code, 75) << r.err;
  EXPECT_NE(r.err.find("stopped for preemption (exit code 75); not restarting"), std::string::npos) << r.err;
  EXPECT_EQ(count_files(envs, "env."), 2) << "one attempt only";
}

// SIGUSR1/SIGUSR2 as torchrun's --signals-to-handle: Slurm's preemption
// warning (scancel --signal=USR1, sbatch --signal) must reach the workers so
// that they can checkpoint, not kill ddprun and with it the workers.
INSTANTIATE_TEST_SUITE_P(Launcher, Forwarding, ::testing::Values(SIGTERM, SIGINT, SIGUSR1, SIGUSR2),
                         [](const auto& info) {
                           switch (info.param) {
                             case SIGTERM: return "SIGTERM";
                             case SIGINT: return "SIGINT";
                             case SIGUSR1: return "SIGUSR1";
                             default: return "SIGUSR2";
                           }
                         });

TEST_F(Launcher, SigkillOfDdprunTakesWorkersAndGrandchildrenAlong) {
  std::string pids = sub("pids");
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())},
                 {"--pid-dir", pids, "--grandchild", "--sleep", "-1"});
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << p->current_err();
  p->signal(SIGKILL);
  Result r = p->wait();
  EXPECT_EQ(r.code, 128 + SIGKILL);
  std::vector<pid_t> all = pids_in(pids, "pid.");
  for (pid_t q : pids_in(pids, "gc.")) all.push_back(q);
  EXPECT_EQ(all.size(), 4u);
  // Workers die by parent-death signal, grandchildren by the watchdog.
  EXPECT_TRUE(wait_for([&] {
    for (pid_t q : all)
      if (alive(q)) return false;
    return children_of(::getpid()).empty();
  }, 60));
}

// ------------------------------------------------------------------- restarts

TEST_F(Launcher, RestartsTheGroupAndCountsRestarts) {
  std::string envs = sub("env");
  Result r = run({"--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--max-restarts", "3",
                  "--term-timeout", "5"},
                 {"--env-dir", envs, "--pid-dir", sub("pids"), "--wait-all", "--fail-until-restart", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (int restart = 0; restart <= 2; ++restart)
    for (int rank = 0; rank < 2; ++rank) {
      auto env = read_env_file(env_path(envs, rank, restart));
      EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], std::to_string(restart));
      EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
    }
  EXPECT_FALSE(fs::exists(env_path(envs, 0, 3)));
  EXPECT_NE(r.err.find("restart 1 of 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restart 2 of 3"), std::string::npos) << r.err;
}

TEST_F(Launcher, GivesUpAfterMaxRestarts) {
  std::string envs = sub("env");
  Result r = run({"--nproc-per-node", "1", "--master-port", std::to_string(free_port()), "--max-restarts", "1"},
                 {"--env-dir", envs, "--fail-rank", "0", "--exit", "4"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_TRUE(fs::exists(env_path(envs, 0, 0)));
  EXPECT_TRUE(fs::exists(env_path(envs, 0, 1)));
  EXPECT_FALSE(fs::exists(env_path(envs, 0, 2)));
}

// ----------------------------------------------------------------- many nodes

void expect_consistent_world(const std::string& envs, int world, int restart = 0) {
  std::set<std::string> ports;
  std::map<std::string, int> offset_of_group;
  for (int rank = 0; rank < world; ++rank) {
    auto env = read_env_file(env_path(envs, rank, restart));
    ASSERT_FALSE(env.empty()) << "no environment from rank " << rank;
    EXPECT_EQ(env["WORLD_SIZE"], std::to_string(world));
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    ports.insert(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]);
    int offset = rank - std::atoi(env["LOCAL_RANK"].c_str());
    auto [it, fresh] = offset_of_group.emplace(env["GROUP_RANK"], offset);
    EXPECT_EQ(it->second, offset) << "ranks of one node are not contiguous";
  }
  EXPECT_EQ(ports.size(), 1u) << "workers disagree on the master";
  EXPECT_EQ(offset_of_group.size(), 2u);
  EXPECT_EQ(offset_of_group["0"], 0);
}

TEST_F(Launcher, TwoNodesOnLoopbackWithStaticRendezvous) {
  std::string envs = sub("env");
  std::string port = std::to_string(free_port());
  // Node 1 first: it must wait for node 0's store.
  auto n1 = start({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "--nproc-per-node", "1"},
                  {"--env-dir", envs});
  auto n0 = start({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "--nproc-per-node", "2"},
                  {"--env-dir", envs});
  Result r0 = n0->wait(), r1 = n1->wait();
  ASSERT_EQ(r0.code, 0) << r0.err;
  ASSERT_EQ(r1.code, 0) << r1.err;
  expect_consistent_world(envs, 3);
  EXPECT_EQ(read_env_file(env_path(envs, 2, 0))["GROUP_RANK"], "1");
  EXPECT_EQ(read_env_file(env_path(envs, 2, 0))["LOCAL_WORLD_SIZE"], "1");
  EXPECT_EQ(read_env_file(env_path(envs, 0, 0))["LOCAL_WORLD_SIZE"], "2");
}

TEST_F(Launcher, TwoNodesOnLoopbackWithC10dRendezvous) {
  std::string envs = sub("env");
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> common{"--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                                  "--rdzv-id", "c10d-test", "--rdzv-conf", "last_call_timeout=60"};
  auto flags = [&](const char* nproc) {
    auto f = common;
    f.insert(f.end(), {"--nproc-per-node", nproc});
    return f;
  };
  // MAX is reached, so the group closes without waiting out the last call.
  auto a = start(flags("2"), {"--env-dir", envs});
  auto b = start(flags("1"), {"--env-dir", envs});
  Result ra = a->wait(), rb = b->wait();
  ASSERT_EQ(ra.code, 0) << ra.err;
  ASSERT_EQ(rb.code, 0) << rb.err;
  expect_consistent_world(envs, 3);
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(read_env_file(env_path(envs, rank, 0))["TORCHELASTIC_RUN_ID"], "c10d-test");
}

TEST_F(Launcher, C10dRejectsAnotherRunIdAndLateNodes) {
  std::string pids = sub("pids");
  std::string go = dir_ + "/go";
  uint16_t port = free_port();
  std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto flags = [&](const std::string& id) {
    return std::vector<std::string>{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                                    "--rdzv-id", id, "--rdzv-conf", "join_timeout=120"};
  };
  std::vector<std::string> worker{"--pid-dir", pids, "--until-file", go};
  auto a = start(flags("run-x"), worker);
  ASSERT_TRUE(wait_for([&] { return port_listening(port); })) << a->current_err();

  Result other = run(flags("run-y"), worker);
  EXPECT_EQ(other.code, 1) << other.err;
  EXPECT_NE(other.err.find("belongs to run 'run-x'"), std::string::npos) << other.err;

  auto b = start(flags("run-x"), worker);
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << a->current_err() << b->current_err();
  Result late = run(flags("run-x"), worker);
  EXPECT_EQ(late.code, 1) << late.err;
  EXPECT_NE(late.err.find("already started"), std::string::npos) << late.err;

  std::ofstream(go) << "go";
  Result ra = a->wait(), rb = b->wait();
  EXPECT_EQ(ra.code, 0) << ra.err;
  EXPECT_EQ(rb.code, 0) << rb.err;
}

TEST_F(Launcher, AFailureOnOneNodeStopsTheOtherWithTheSameExitCode) {
  std::string pids = sub("pids");
  std::string port = std::to_string(free_port());
  std::vector<std::string> worker{"--pid-dir", pids, "--fail-rank", "1", "--exit", "9", "--wait-all", "--sleep",
                                  "-1", "--error-json",
                                  R"({"message": {"message": "RuntimeError: node one broke", "extraInfo": {}}})"};
  auto n0 = start({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "--term-timeout", "5"}, worker);
  auto n1 = start({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "--term-timeout", "5"}, worker);
  Result r0 = n0->wait(), r1 = n1->wait();
  EXPECT_EQ(r1.code, 9) << r1.err;
  EXPECT_EQ(r0.code, 9) << r0.err;
  EXPECT_NE(r0.err.find("rank 1 (local rank 0)"), std::string::npos) << r0.err;
  // The failing worker's message travels with the failure record.
  EXPECT_NE(r0.err.find("message   : RuntimeError: node one broke"), std::string::npos) << r0.err;
  EXPECT_NE(r1.err.find("traceback : RuntimeError: node one broke"), std::string::npos) << r1.err;
  for (pid_t p : pids_in(pids, "pid.")) EXPECT_FALSE(alive(p));
}

TEST_F(Launcher, NodesRestartTogether) {
  std::string envs = sub("env");
  std::string port = std::to_string(free_port());
  // Rank 1 (on node 1) fails in the first attempt only; both nodes restart.
  std::vector<std::string> worker{"--env-dir", envs, "--pid-dir", sub("pids"), "--wait-all", "--fail-until-restart",
                                  "1", "--fail-rank", "1"};
  auto n0 = start({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "--max-restarts", "2",
                   "--term-timeout", "5"},
                  worker);
  auto n1 = start({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "--max-restarts", "2",
                   "--term-timeout", "5"},
                  worker);
  Result r0 = n0->wait(), r1 = n1->wait();
  ASSERT_EQ(r0.code, 0) << r0.err;
  ASSERT_EQ(r1.code, 0) << r1.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(read_env_file(env_path(envs, rank, 1))["TORCHELASTIC_RESTART_COUNT"], "1");
    EXPECT_FALSE(fs::exists(env_path(envs, rank, 2)));
  }
}

// A node whose ddprun vanishes (SIGKILL) is noticed: through missing
// keep-alives when it was a client, through the lost store when it hosted it.
class VanishingNode : public LauncherTest, public ::testing::WithParamInterface<int> {};

TEST_P(VanishingNode, TheOtherNodeStopsItsWorkers) {
  int victim = GetParam();
  std::string pids = sub("pids");
  std::string port = std::to_string(free_port());
  std::vector<std::unique_ptr<Process>> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.push_back(start({"--nnodes", "2", "--node-rank", std::to_string(node), "--master-port", port,
                           "--term-timeout", "5", "--rdzv-conf", "keep_alive_interval=0.5,keep_alive_max_attempt=4"},
                          {"--pid-dir", pids, "--sleep", "-1"}));
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; }))
      << nodes[0]->current_err() << nodes[1]->current_err();
  nodes[victim]->signal(SIGKILL);
  EXPECT_EQ(nodes[victim]->wait().code, 128 + SIGKILL);
  Result survivor = nodes[1 - victim]->wait();
  EXPECT_EQ(survivor.code, 1) << survivor.err;
  EXPECT_NE(survivor.err.find(victim == 1 ? "sent no keep-alive" : "lost contact with the rendezvous store"),
            std::string::npos)
      << survivor.err;
  EXPECT_TRUE(wait_for([&] {
    for (pid_t p : pids_in(pids, "pid."))
      if (alive(p)) return false;
    return true;
  }, 60));
}

INSTANTIATE_TEST_SUITE_P(Launcher, VanishingNode, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "StoreHost" : "Client"; });

// ------------------------------------------------------------------ bad input

void expect_one_error_line(const Result& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.err;
  auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("ddprun: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
}

TEST_F(Launcher, BadCommandLinesExitWithTwoAndOneLine) {
  auto bad = [&](std::vector<std::string> argv, const std::string& needle) {
    argv.insert(argv.begin(), DDPRUN_BIN);
    Result r = Process(argv, {}, dir_).wait();
    SCOPED_TRACE(argv.size() > 1 ? argv[1] : "");
    expect_one_error_line(r, 2, needle);
  };
  bad({"--no-such-flag", TEST_WORKER_BIN}, "unknown option '--no-such-flag'");
  bad({"--nproc-per-node", "many", TEST_WORKER_BIN}, "--nproc-per-node");
  bad({"--nproc-per-node", "0", TEST_WORKER_BIN}, "--nproc-per-node");
  bad({"--nnodes", "3:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", TEST_WORKER_BIN}, "--nnodes");
  bad({"--nnodes", "1:2", TEST_WORKER_BIN}, "static rendezvous");
  bad({"--nnodes", "2", "--node-rank", "2", TEST_WORKER_BIN}, "--node-rank");
  bad({"--redirects", "5", TEST_WORKER_BIN}, "--redirects");
  bad({"--master-port", "70000", TEST_WORKER_BIN}, "--master-port");
  bad({"--rdzv-backend", "etcd", TEST_WORKER_BIN}, "--rdzv-backend");
  bad({"--max-restarts", "-1", TEST_WORKER_BIN}, "--max-restarts");
  bad({"--nproc-per-node", "2"}, "no PROGRAM");
  bad({"--", "/no/such/program"}, "/no/such/program");
  bad({"no-such-program-in-path"}, "not found in PATH");
  std::string script = dir_ + "/not_executable";
  std::ofstream(script) << "#!/bin/sh\n";
  bad({script}, "not executable");
}

TEST_F(Launcher, PortInUseAndUnreachableMasterExitWithOne) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  std::string busy = std::to_string(ntohs(a.sin_port));

  expect_one_error_line(run({"--master-port", busy}, {}), 1, "--master-port " + busy);
  expect_one_error_line(run({"--nnodes", "2", "--node-rank", "0", "--master-port", busy}, {}), 1,
                        "port " + busy);
  ::close(s);

  std::string closed = std::to_string(free_port());
  expect_one_error_line(run({"--nnodes", "2", "--node-rank", "1", "--master-port", closed, "--rdzv-conf",
                             "join_timeout=2"},
                            {}),
                        1, "cannot reach the rendezvous store at 127.0.0.1:" + closed);
}

TEST_F(Launcher, HelpListsEveryFlag) {
  Result r = Process({DDPRUN_BIN, "--help"}, {}, dir_).wait();
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                           "--standalone", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--max-restarts",
                           "--monitor-interval", "--log-dir", "--redirects", "--tee", "--local-ranks-filter",
                           "--term-timeout", "Examples:"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST_F(Launcher, VersionPrintsTheProjectVersionAndTheBackends) {
  Result r = Process({DDPRUN_BIN, "--version"}, {}, dir_).wait();
  EXPECT_EQ(r.code, 0) << r.err;
  // The version, then the backends libddp was built with (CMake's list).
  EXPECT_EQ(r.out, "ddprun (libddp) " DDP_PROJECT_VERSION "\nbackends: " DDP_BACKENDS "\n");
  EXPECT_EQ(r.err, "");
  // Like --help, it needs no PROGRAM and ignores one.
  EXPECT_EQ(Process({DDPRUN_BIN, "--version", "/no/such/program"}, {}, dir_).wait().code, 0);
}

// The last line of --help, "Documentation: PATH", for the ddprun at `binary`.
std::string documentation_line(const std::string& binary, const std::string& dir) {
  Result r = Process({binary, "--help"}, {}, dir).wait();
  EXPECT_EQ(r.code, 0) << r.err;
  auto lines = lines_of(r.out);
  return lines.empty() ? "" : lines.back();
}

TEST_F(Launcher, HelpEndsWithTheSourceTreesDocsInTheBuildTree) {
  std::string line = documentation_line(DDPRUN_BIN, dir_);
  ASSERT_EQ(line.rfind("Documentation: ", 0), 0u) << line;
  std::string path = line.substr(std::string("Documentation: ").size());
  EXPECT_TRUE(fs::is_regular_file(path)) << path;
  EXPECT_EQ(fs::path(path).filename(), "launcher.md") << path;
}

TEST_F(Launcher, HelpPointsAtTheDocsInstalledBesideDdprun) {
  // An installation moved to another prefix: bin/ddprun finds
  // share/doc/ddp/launcher.md of its own prefix, not the source tree's.
  fs::path prefix = fs::canonical(dir_) / "relocated";
  fs::create_directories(prefix / "bin");
  fs::create_directories(prefix / "share" / "doc" / "ddp");
  fs::copy_file(DDPRUN_BIN, prefix / "bin" / "ddprun");
  fs::permissions(prefix / "bin" / "ddprun", fs::perms::owner_all, fs::perm_options::add);
  std::ofstream(prefix / "share" / "doc" / "ddp" / "launcher.md") << "# ddprun\n";
  EXPECT_EQ(documentation_line((prefix / "bin" / "ddprun").string(), dir_),
            "Documentation: " + (prefix / "share" / "doc" / "ddp" / "launcher.md").string());
}

}  // namespace
}  // namespace ddprun_test
