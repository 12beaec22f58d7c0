// A worker that stops responding: stopped with SIGSTOP while the others run.
// It is no failure by itself (a debugger may hold it, or someone resumes it),
// but when the group fails, ddprun names it as the root cause and kills it at
// once: a stopped process cannot run the SIGTERM handler the grace period
// waits for.
#include <chrono>

#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;

char proc_state(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

TEST_F(Launcher, AStoppedWorkerIsNamedAsTheRootCauseAndKilledWithoutTheGracePeriod) {
  std::string pids = sub("pids");
  std::string go = dir_ + "/go";
  // Rank 1 traps SIGTERM (as a training program that saves on SIGTERM does);
  // rank 0 fails once the test has stopped rank 1, as a collective's timeout
  // would make it.
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port()), "--term-timeout", "60"},
                 {"--pid-dir", pids, "--trap-dir", pids, "--fail-rank", "0", "--exit", "1", "--wait-all",
                  "--fail-when-file", go, "--sleep", "-1"});
  ASSERT_TRUE(wait_for([&] { return fs::exists(pids + "/pid.1.0"); })) << p->current_err();
  const pid_t stalled = std::stoi(read_file(pids + "/pid.1.0"));
  ASSERT_EQ(::kill(stalled, SIGSTOP), 0);
  ASSERT_TRUE(wait_for([&] { return proc_state(stalled) == 'T'; }, 10));
  const auto stopped_at = std::chrono::steady_clock::now();
  { std::ofstream(go) << "go"; }
  Result r = p->wait(150);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  std::cout << "SIGSTOP of rank 1 to ddprun's exit: " << seconds << " s (--term-timeout 60)" << std::endl;
  RecordProperty("seconds_to_exit", std::to_string(seconds));

  EXPECT_EQ(r.code, 1) << r.err;
  // Generous: only "not the whole grace period".
  EXPECT_LT(seconds, 40) << r.err;
  size_t root = r.err.find("Root Cause");
  size_t others = r.err.find("Other Failures");
  ASSERT_NE(root, std::string::npos) << r.err;
  ASSERT_NE(others, std::string::npos) << r.err;
  std::string root_block = r.err.substr(root, others - root);
  EXPECT_NE(root_block.find("rank 1 (pid " + std::to_string(stalled) + ") was stopped"), std::string::npos) << r.err;
  EXPECT_NE(root_block.find("rank      : 1"), std::string::npos) << r.err;
  // Rank 0's failure follows from it and is listed below.
  EXPECT_NE(r.err.substr(others).find("rank      : 0"), std::string::npos) << r.err;
  // The stopped worker's trap never ran: it was killed, not terminated.
  EXPECT_FALSE(fs::exists(pids + "/sig.1")) << r.err;
}

// Stopped and resumed before anything failed: nothing to report.
TEST_F(Launcher, AWorkerStoppedAndResumedIsNoFailure) {
  std::string pids = sub("pids");
  std::string go = dir_ + "/go";
  auto p = start({"--nproc-per-node", "2", "--master-port", std::to_string(free_port())},
                 {"--pid-dir", pids, "--until-file", go});
  ASSERT_TRUE(wait_for([&] { return fs::exists(pids + "/pid.1.0"); })) << p->current_err();
  const pid_t pid = std::stoi(read_file(pids + "/pid.1.0"));
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(wait_for([&] { return proc_state(pid) == 'T'; }, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a monitor pass or more sees it stopped
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  { std::ofstream(go) << "go"; }
  Result r = p->wait(60);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("stopped"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddprun_test
