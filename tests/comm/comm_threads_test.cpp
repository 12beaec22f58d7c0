// Gloo's threads are named gloo-loop and gloo-worker; DDP_GLOO_LOOP_POLICY=idle
// moves the event loop to SCHED_IDLE, so that its spinning never takes a CPU
// that a rank's compute or Gloo's workers want (src/comm/backend/comm_threads.h); the
// default leaves it as Gloo starts it. A one-rank group over a real TCP store
// is enough to see the threads.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <vector>
#include <string>

#include "../support/reserved_port.h"
#include "ddp/comm/process_group.h"

namespace {

// Scheduling policy of every thread of this process with the given name.
std::vector<int> policies_of(const std::string& name) {
  std::vector<int> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string n;
    if (std::getline(comm, n) && n == name) out.push_back(sched_getscheduler(std::stoi(task.path().filename())));
  }
  return out;
}

std::shared_ptr<ddp::ProcessGroup> one_rank_gloo_group() {
  ddp::LaunchEnv env;
  env.master_port = ddp::testing::reserved_port();
  return ddp::init_process_group(env, ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(30)));
}

struct PolicyEnv {
  explicit PolicyEnv(const char* value) {
    if (value) setenv("DDP_GLOO_LOOP_POLICY", value, 1);
    else unsetenv("DDP_GLOO_LOOP_POLICY");
  }
  ~PolicyEnv() {
    unsetenv("DDP_GLOO_LOOP_POLICY");
    ddp::destroy_process_group();
  }
};

}  // namespace

TEST(CommThreads, PolicyIdleMovesTheGlooLoopToSchedIdleAndTheWorkersStayNormal) {
  PolicyEnv env("idle");
  auto pg = one_rank_gloo_group();
  const auto loops = policies_of("gloo-loop");
  ASSERT_FALSE(loops.empty()) << "no thread named gloo-loop: the Gloo event loop was not found";
  for (int p : loops) EXPECT_EQ(p, SCHED_IDLE);
  const auto workers = policies_of("gloo-worker");
  ASSERT_FALSE(workers.empty());
  for (int p : workers) EXPECT_EQ(p, SCHED_OTHER);
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);  // the caller's own thread is untouched
  auto t = torch::ones({4});
  pg->allreduce(t).wait();  // the group still works
  EXPECT_EQ(t.sum().item<float>(), 4.0f);
}

TEST(CommThreads, ByDefaultTheLoopIsNamedAndLeftAsGlooStartsIt) {
  PolicyEnv env(nullptr);
  auto pg = one_rank_gloo_group();
  const auto loops = policies_of("gloo-loop");
  ASSERT_FALSE(loops.empty());
  // Threads of earlier groups in this process may still be named gloo-loop;
  // the one just made is the only one under SCHED_OTHER.
  EXPECT_NE(std::count(loops.begin(), loops.end(), SCHED_OTHER), 0);
}

TEST(CommThreads, PolicyNormalIsTheDefaultSpelledOut) {
  PolicyEnv env("normal");
  auto pg = one_rank_gloo_group();
  const auto loops = policies_of("gloo-loop");
  EXPECT_NE(std::count(loops.begin(), loops.end(), SCHED_OTHER), 0);
}

TEST(CommThreads, AnUnknownPolicyIsAUsageErrorNamingTheVariable) {
  PolicyEnv env("fast");
  try {
    one_rank_gloo_group();
    FAIL() << "expected a UsageError";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_GLOO_LOOP_POLICY"), std::string::npos) << e.what();
  }
}
