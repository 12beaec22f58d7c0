// ddprun across several nodes on loopback: static and c10d rendezvous, a
// failure or a vanishing node stopping the others, restarts together, a
// late node admitted (c10d) and one beyond MAX waiting.
#include <set>

#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;


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

TEST_F(Launcher, C10dRejectsAnotherRunIdAndANodeBeyondMaxWaits) {
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
  // A node beyond MAX waits for a place, says so, and is told when the run
  // ends without one.
  auto late = start(flags("run-x"), worker);
  ASSERT_TRUE(wait_for([&] { return late->current_err().find("maximum of 2 nodes") != std::string::npos; }))
      << late->current_err();
  std::ofstream(go) << "go";
  Result ra = a->wait(), rb = b->wait(), rl = late->wait();
  EXPECT_EQ(ra.code, 0) << ra.err;
  EXPECT_EQ(rb.code, 0) << rb.err;
  EXPECT_EQ(rl.code, 1) << rl.err;
  EXPECT_NE(rl.err.find("while this node waited"), std::string::npos) << rl.err;
  EXPECT_EQ(count_files(pids, "pid."), 2) << "the waiting node started no worker";
}

// torchrun's scale-up: a node that arrives while a 1:2 group runs waits, the
// running node restarts its workers to let it in, and nothing counts as a
// restart; the membership change is one line naming the newcomer.
TEST_F(Launcher, C10dAdmitsALateNodeWithoutCountingARestart) {
  std::string envs = sub("env"), pids = sub("pids");
  std::string go = dir_ + "/go";
  std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> flags{"--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                                 "--rdzv-id", "grow", "--rdzv-conf", "join_timeout=60,last_call_timeout=1",
                                 "--term-timeout", "5", "--max-restarts", "0"};
  std::vector<std::string> worker{"--env-dir", envs, "--pid-dir", pids, "--until-file", go};
  auto a = start(flags, worker);
  ASSERT_TRUE(wait_for([&] { return count_files(pids, "pid.") == 1; })) << a->current_err();
  auto b = start(flags, worker);
  ASSERT_TRUE(wait_for([&] { return b->current_err().find("waits to be admitted") != std::string::npos; }))
      << b->current_err();
  // Rank 1 exists only in the round that admitted b.
  ASSERT_TRUE(wait_for([&] { return fs::exists(env_path(envs, 1, 0)); })) << a->current_err() << b->current_err();
  std::ofstream(go) << "go";
  Result ra = a->wait(), rb = b->wait();
  ASSERT_EQ(ra.code, 0) << ra.err;
  ASSERT_EQ(rb.code, 0) << rb.err;
  expect_consistent_world(envs, 2);
  for (int rank = 0; rank < 2; ++rank) {
    auto env = read_env_file(env_path(envs, rank, 0));
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0") << "a membership change counted as a restart";
    EXPECT_EQ(env["DDPRUN_RDZV_ROUND"], "1");
  }
  EXPECT_NE(ra.err.find("membership changed in round 1: world size 1 -> 2, nodes 1 -> 2; joined: "),
            std::string::npos) << ra.err;
  EXPECT_NE(rb.err.find("joined run 'grow' in round 1 as node 1 of 2, world size 2"), std::string::npos) << rb.err;
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

}  // namespace
}  // namespace ddprun_test
