// In-process recovery (ddprun --recover-in-process, ddp/comm/recovery.h):
// three workers train a small model with DistributedDataParallel on a
// recoverable group and one fails at a step. The others re-form without it
// in their own processes (each started once), go on at the smaller world
// size, and end bitwise equal to each other and, up to rounding, equal to
// the same steps trained in one process: the failed step was applied on no
// rank and trained again, and every step's gradient is the whole batch's.
// Under a ZeroRedundancyOptimizer (Adam) the lost rank's shard comes from
// the rank that kept its second copy: the same, to rounding, as Adam in one
// process; a rank lost once its step committed costs no step again.
#include <fstream>
#include <thread>

#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

struct Fault {
  const char* name;
  int slot;
  int step;
  const char* how;  // recovery_worker's: kill, stop, exit, commit
  bool zero = false;
  int attempts = 7;  // one step trained again
};

class Recovery : public LauncherTest, public ::testing::WithParamInterface<Fault> {
 protected:
  // mode: "" (SGD), "zero" (RECOVERY_WORKER_ZERO) or "join" (RECOVERY_WORKER_JOIN).
  Result train(const std::string& out, const std::vector<std::string>& fault, const std::string& mode = "",
               const std::string& steps = "6") {
    std::vector<std::string> argv{DDPRUN_BIN, "--standalone", "--nproc-per-node", "3", "--recover-in-process",
                                  RECOVERY_WORKER_BIN, out, steps};
    argv.insert(argv.end(), fault.begin(), fault.end());
    return Process(argv,
                   {{"OMP_NUM_THREADS", "1"},
                    {"RECOVERY_WORKER_ZERO", mode == "zero" ? "1" : "0"},
                    {"RECOVERY_WORKER_JOIN", mode == "join" ? "1" : "0"}},
                   dir_)
        .wait(180);
  }

  static std::map<std::string, std::string> result_of(const std::string& path) {
    std::map<std::string, std::string> out;
    for (const auto& line : lines_of(read_file(path))) {
      const auto space = line.find(' ');
      if (space != std::string::npos) out[line.substr(0, space)] = line.substr(space + 1);
    }
    return out;
  }
};

TEST_P(Recovery, TheOthersGoOnInTheirProcessesAndEndEqual) {
  const Fault f = GetParam();
  const std::string out = sub("out");
  Result r = train(out, {std::to_string(f.slot), std::to_string(f.step), f.how}, f.zero ? "zero" : "");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--recover-in-process"), std::string::npos) << r.err;
  if (f.zero) EXPECT_NE(r.err.find("re-sharded over launch ranks"), std::string::npos) << r.err;
  if (std::string(f.how) == "commit")
    EXPECT_NE(r.err.find("the parameters' broadcast failed"), std::string::npos) << r.err;
  std::vector<int> survivors;
  for (int s = 0; s < 3; ++s)
    if (s != f.slot) survivors.push_back(s);
  const std::string members = std::to_string(survivors[0]) + "," + std::to_string(survivors[1]);
  for (int s = 0; s < 3; ++s)
    EXPECT_EQ(lines_of(read_file(out + "/starts." + std::to_string(s))).size(), 1u) << "slot " << s << " restarted";
  EXPECT_FALSE(fs::exists(out + "/result." + std::to_string(f.slot)));
  for (int s : survivors) {
    auto result = result_of(out + "/result." + std::to_string(s));
    EXPECT_EQ(result["generation"], "1") << "slot " << s;
    EXPECT_EQ(result["members"], members) << "slot " << s;
    EXPECT_EQ(result["committed"], "6") << "slot " << s;
    EXPECT_EQ(result["attempts"], std::to_string(f.attempts)) << "slot " << s << ": steps trained again";
    EXPECT_LT(std::stod(result["diff"]), 1e-12) << "slot " << s << ": not the same steps as in one process";
  }
  EXPECT_EQ(read_file(out + "/params." + std::to_string(survivors[0])),
            read_file(out + "/params." + std::to_string(survivors[1])));
}

// Rank 1 dies in step 3, and rank 2 in the same step's retry, right after
// the group re-formed: it re-forms again, and rank 0 trains on alone.
TEST_F(Recovery, ASecondFaultRightAfterReformingCostsAnotherStep) {
  const std::string out = sub("out");
  Result r = train(out, {"1", "3", "twice"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto result = result_of(out + "/result.0");
  EXPECT_EQ(result["generation"], "2");
  EXPECT_EQ(result["members"], "0");
  EXPECT_EQ(result["committed"], "6");
  EXPECT_EQ(result["attempts"], "8");
  EXPECT_LT(std::stod(result["diff"]), 1e-12);
}

// Under a ZeroRedundancyOptimizer ranks 1 and 2 die in the same step: on
// one node the shard of rank 1 has its second copy on rank 2. Rank 0 says it
// cannot go on exactly and what to do, and ends non-zero.
TEST_F(Recovery, ZeroTwoNeighboursLostTogetherTakeTheirShard) {
  const std::string out = sub("out");
  Result r = train(out, {"1", "2", "pair"}, "zero");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("the optimizer's shard of launch rank 1 was lost with both ranks that held it"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restart it from its last checkpoint"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out + "/result.0"));
}

// Uneven inputs under ddp::Join: launch rank s has 6 - s steps. Rank 1
// dies in its fifth step (step 4), which rank 2, out of inputs, shadows:
// ranks 0 and 2 re-form, rank 0 trains step 4 again and on to the end while
// rank 2 shadows and votes, and both end with rank 0's model.
TEST_F(Recovery, AJoinedRankVotesOnTheStepsItShadows) {
  const std::string out = sub("out");
  Result r = train(out, {"1", "4", "kill"}, "join");
  ASSERT_EQ(r.code, 0) << r.err;
  auto first = result_of(out + "/result.0"), joined = result_of(out + "/result.2");
  EXPECT_EQ(first["members"], "0,2");
  EXPECT_EQ(first["committed"], "6");
  EXPECT_EQ(first["attempts"], "7");
  EXPECT_EQ(joined["committed"], "4");
  EXPECT_LT(std::stod(first["diff"]), 1e-12);
  EXPECT_LT(std::stod(joined["diff"]), 1e-12) << "rank 2 did not end with the model of the last to finish";
  EXPECT_EQ(read_file(out + "/params.0"), read_file(out + "/params.2"));
}

// The same with 7 steps, and rank 0 (the last to finish) dies once its
// step 6 committed: the two others had run out before it and hold older
// models. They say the newest model is lost and end non-zero.
TEST_F(Recovery, JoinLostWithTheLastRankToFinishIsStateLost) {
  const std::string out = sub("out");
  Result r = train(out, {"0", "6", "commit"}, "join", "7");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("every rank that trained to the end was lost"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out + "/result.1"));
}

// With --max-restarts 1 ddprun starts a worker in rank 1's place; the two
// others take it in at a step boundary and hand it their state, the
// ZeroRedundancyOptimizer its shards anew: the three end bitwise equal, in
// the group's third generation.
TEST_F(Recovery, AReplacementJoinsLiveAndEndsEqual) {
  const std::string out = sub("out");
  Process p({DDPRUN_BIN, "--standalone", "--nproc-per-node", "3", "--recover-in-process", "--max-restarts", "1",
             RECOVERY_WORKER_BIN, out, "200", "1", "3", "kill"},
            {{"OMP_NUM_THREADS", "1"}, {"RECOVERY_WORKER_STEP_MS", "100"}, {"RECOVERY_WORKER_ZERO", "1"}}, dir_);
  Result r = p.wait(180);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("starting a worker in place of rank 1"), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(read_file(out + "/starts.1")).size(), 2u);
  for (int s = 0; s < 3; ++s) {
    auto result = result_of(out + "/result." + std::to_string(s));
    EXPECT_EQ(result["generation"], "2") << "slot " << s;
    EXPECT_EQ(result["members"], "0,1,2") << "slot " << s;
    EXPECT_EQ(result["committed"], "200") << "slot " << s;
    EXPECT_LT(std::stod(result["diff"]), 1e-12) << "slot " << s;
    EXPECT_EQ(read_file(out + "/params." + std::to_string(s)), read_file(out + "/params.0")) << "slot " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, Recovery,
                         ::testing::Values(Fault{"Sigkill", 1, 3, "kill"}, Fault{"RankZeroAtTheFirstStep", 0, 0, "kill"},
                                           Fault{"Sigstop", 2, 2, "stop"}, Fault{"ExitCode", 1, 5, "exit"},
                                           Fault{"ZeroSigkill", 1, 3, "kill", true},
                                           Fault{"ZeroKilledOnceTheStepCommitted", 2, 3, "commit", true, 6}),
                         [](const auto& info) { return std::string(info.param.name); });

// Two nodes of two workers each (static rendezvous on loopback): a worker
// of node 1 is lost (its ddprun reports it), or node 1 as a whole (its
// ddprun killed: node 0 sees its keep-alive lapse; --nnodes 1:2 lets one
// node go on). Node 0's workers, and node 1's that remain, go on; every
// ddprun still running exits 0. The whole node lost under a
// ZeroRedundancyOptimizer: its shards' second copies were on node 0.
class TwoNodeRecovery : public LauncherTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TwoNodeRecovery, TheWorkersLeftGoOn) {
  const bool node_lost = GetParam() == "node";
  const std::string out = sub("out");
  const std::string port = std::to_string(free_port());
  // A whole node lost: --nnodes 1:2 (elastic, c10d) lets one go on; node 0
  // starts first, so it serves the store and is GROUP_RANK 0.
  const std::vector<std::string> rendezvous =
      node_lost ? std::vector<std::string>{"--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                           "127.0.0.1:" + port, "--rdzv-conf",
                                           "last_call_timeout=60,keep_alive_interval=0.5,keep_alive_max_attempt=4"}
                : std::vector<std::string>{"--nnodes", "2", "--master-port", port, "--rdzv-conf",
                                           "keep_alive_interval=0.5,keep_alive_max_attempt=4"};
  std::vector<std::unique_ptr<Process>> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv{DDPRUN_BIN};
    argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
    if (!node_lost) argv.insert(argv.end(), {"--node-rank", std::to_string(node)});
    argv.insert(argv.end(), {"--nproc-per-node", "2", "--recover-in-process", RECOVERY_WORKER_BIN, out, "6", "3", "2",
                             GetParam()});
    nodes.push_back(std::make_unique<Process>(
        argv, Env{{"OMP_NUM_THREADS", "1"}, {"RECOVERY_WORKER_ZERO", node_lost ? "1" : "0"}}, dir_));
    if (node_lost && node == 0)
      ASSERT_TRUE(listening_within(static_cast<uint16_t>(std::stoi(port)), 30)) << nodes[0]->current_err();
  }
  Result first = nodes[0]->wait(180);
  Result second = nodes[1]->wait(180);
  ASSERT_EQ(first.code, 0) << first.err << second.err;
  EXPECT_EQ(second.code, node_lost ? 128 + SIGKILL : 0) << second.err;
  if (node_lost) EXPECT_NE(first.err.find("sent no keep-alive"), std::string::npos) << first.err;
  if (node_lost) EXPECT_NE(first.err.find("re-sharded over launch ranks 0,1 (from 0,1,2,3)"), std::string::npos)
      << first.err;
  const std::vector<int> survivors = node_lost ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
  const std::string members = node_lost ? "0,1" : "0,1,2";
  for (int s : survivors) {
    const std::string result = read_file(out + "/result." + std::to_string(s));
    EXPECT_NE(result.find("members " + members + "\n"), std::string::npos) << "slot " << s << ": " << result;
    EXPECT_NE(result.find("committed 6\n"), std::string::npos) << "slot " << s << ": " << result;
    const auto diff = result.find("diff ");
    ASSERT_NE(diff, std::string::npos) << result;
    EXPECT_LT(std::stod(result.substr(diff + 5)), 1e-12) << "slot " << s << ": not the steps of one process";
    EXPECT_EQ(read_file(out + "/params." + std::to_string(s)), read_file(out + "/params.0")) << "slot " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Lost, TwoNodeRecovery, ::testing::Values("kill", "node"),
                         [](const auto& info) { return info.param == "kill" ? std::string("Worker") : "Node"; });

// Two nodes of one worker (c10d, --nnodes 1:2); node 1 is lost as a whole
// at step 2, and node 0's worker goes on alone. A ddprun started later takes
// the lost node's place in the running round: its worker joins at a step
// boundary with the state of the others, and both end equal, every step
// committed once, node 0's worker never restarted.
TEST_F(LauncherTest, ANodeArrivingLaterTakesTheLostNodesPlace) {
  const std::string out = sub("out");
  const uint16_t port = free_port();
  const std::vector<std::string> flags{
      DDPRUN_BIN, "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
      "127.0.0.1:" + std::to_string(port), "--rdzv-conf",
      "last_call_timeout=60,keep_alive_interval=0.5,keep_alive_max_attempt=4", "--nproc-per-node", "1",
      "--recover-in-process", RECOVERY_WORKER_BIN, out, "10", "1", "2", "node"};
  const Env env{{"OMP_NUM_THREADS", "1"}, {"RECOVERY_WORKER_STEP_MS", "1500"}};
  Process first(flags, env, dir_);
  // Node 0 serves the store before node 1 starts: the node lost must not be the one that serves it.
  ASSERT_TRUE(listening_within(port, 30)) << first.current_err();
  Result lost = Process(flags, env, dir_).wait(120);
  EXPECT_EQ(lost.code, 128 + SIGKILL) << lost.err;
  Result late = Process(flags, env, dir_).wait(120);
  Result kept = first.wait(120);
  ASSERT_EQ(kept.code, 0) << kept.err << late.err;
  ASSERT_EQ(late.code, 0) << late.err << kept.err;
  EXPECT_NE(late.err.find("took the place of lost node 1"), std::string::npos) << late.err;
  EXPECT_NE(kept.err.find("took the lost node's place"), std::string::npos) << kept.err;
  EXPECT_EQ(lines_of(read_file(out + "/starts.0")).size(), 1u) << "node 0's worker restarted";
  EXPECT_EQ(lines_of(read_file(out + "/starts.1")).size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const std::string result = read_file(out + "/result." + std::to_string(s));
    EXPECT_NE(result.find("members 0,1\n"), std::string::npos) << "slot " << s << ": " << result;
    EXPECT_NE(result.find("committed 10\n"), std::string::npos) << "slot " << s << ": " << result;
  }
  EXPECT_EQ(read_file(out + "/params.1"), read_file(out + "/params.0"));
}

// A program on a plain init_process_group under --recover-in-process: every
// rank, rank 0 too, joins ddprun's store (TORCHELASTIC_USE_AGENT_STORE=True)
// instead of rank 0 serving one at MASTER_PORT, which ddprun's holds.
TEST_F(LauncherTest, APlainProcessGroupJoinsTheLaunchersStore) {
  const std::string out = sub("out");
  std::ofstream(out + "/go").flush();
  Process p({DDPRUN_BIN, "--standalone", "--nproc-per-node", "2", "--recover-in-process", STORE_WORKER_BIN, out}, {},
            dir_);
  Result r = p.wait(120);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out + "/ready.0") && fs::exists(out + "/ready.1")) << r.err;
}

// Without --recover-in-process the same program is refused at its start,
// on every rank, with what to do.
TEST_F(LauncherTest, RecoverableGroupNeedsRecoverInProcess) {
  Process p({DDPRUN_BIN, "--standalone", "--nproc-per-node", "2", RECOVERY_WORKER_BIN, sub("out"), "2"}, {}, dir_);
  Result r = p.wait(120);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("start it with ddprun --recover-in-process"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddprun_test
