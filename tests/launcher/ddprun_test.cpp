// End-to-end tests of ddprun on one node: environment, output, teardown,
// signals, restarts, bad input. Real launchers, real workers (test_worker),
// real signals and sockets. No timing assertions: timeouts only stop hangs.
// Beside it: ddprun_nodes_test.cpp, ddprun_python_test.cpp,
// ddprun_error_file_test.cpp.
#include <regex>
#include <set>

#include "../support/located.h"
#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;

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

// The summary calls exit 75 what it is: a stop with a checkpoint, to resume
// from, not a failure with a root cause; ddprun still exits 75.
TEST_F(LauncherTest, APreemptionIsSummarizedAsAStopWithACheckpointNotAFailure) {
  std::string pids = sub("pids"), traps = sub("traps");
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())},
                 {"--pid-dir", pids, "--trap-dir", traps, "--on-warning", "75", "--sleep", "-1"});
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << p->current_err();
  p->signal(SIGUSR1);
  Result r = p->wait();
  EXPECT_EQ(r.code, 75) << r.err;
  EXPECT_NE(r.err.find("STOPPED FOR PREEMPTION (not a failure)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Stopped For Preemption (first worker to stop)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("saved a checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumes from that checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("<NO_FAILURES>"), std::string::npos) << "the other rank stopped too:\n" << r.err;
  for (const char* failure : {" FAILED", "Root Cause", "traceback : <N/A> (the worker wrote no error file"})
    EXPECT_EQ(r.err.find(failure), std::string::npos) << "'" << failure << "' in:\n" << r.err;
}

// Rank 0 stops for preemption and, seen in the same poll, rank 1 crashes:
// the header must not call that "not a failure". ddprun is held with
// SIGSTOP while both exit, so that it sees them together, in rank order.
TEST_F(LauncherTest, APreemptionWithACrashedWorkerIsSummarizedWithItsFailures) {
  std::string pids = sub("pids"), traps = sub("traps");
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())},
                 {"--pid-dir", pids, "--trap-dir", traps, "--on-warning", "75", "--fail-rank", "1", "--signal-self",
                  std::to_string(SIGSEGV), "--fail-when-file", traps + "/warn.0", "--sleep", "-1"});
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 2; })) << p->current_err();
  std::vector<pid_t> ranks;
  for (const char* rank : {"/pid.0.0", "/pid.1.0"}) {
    std::ifstream f(pids + rank);
    pid_t pid = 0;
    f >> pid;
    ranks.push_back(pid);
  }
  p->signal(SIGSTOP);
  ASSERT_EQ(::kill(ranks[0], SIGUSR1), 0);
  const bool both_exited = wait_for([&] { return !alive(ranks[0]) && !alive(ranks[1]); }, 60);
  p->signal(SIGCONT);
  ASSERT_TRUE(both_exited);
  Result r = p->wait();
  EXPECT_NE(r.err.find("STOPPED FOR PREEMPTION, WITH FAILURES"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("(not a failure)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Stopped For Preemption (first worker to stop)"), std::string::npos) << r.err;
  const size_t failures = r.err.find("\nFailures:\n");
  ASSERT_NE(failures, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank      : 1", failures), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(SIGSEGV)", failures), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("<NO_FAILURES>"), std::string::npos) << r.err;
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

// ------------------------------------------------------------------ bad input


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

  // Reserved by this process and never listened on: every connection to it is refused.
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
