// The mpi backend across real processes started by a real Open MPI mpirun
// (one node, loopback): DDP's gradient-equivalence scenarios of
// ddp_multiprocess_test.cpp at 2 and 4 ranks, and a collective one rank
// never joins. Skips without mpirun or in a build without MPI.
#include <gtest/gtest.h>

#include <tuple>

#include "../support/located.h"
#include "../support/multiprocess.h"

using namespace ddp::testing;

namespace {

#define SKIP_WITHOUT_MPI()                                                                              \
  do {                                                                                                  \
    if (!libddp_has_mpi())                                                             \
      GTEST_SKIP() << "this libddp has no mpi backend (CMake found no MPI; apt-get install libopenmpi-dev)"; \
    if (mpirun_path().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";      \
  } while (0)

// The scenarios of DDPWorld in ddp_multiprocess_test.cpp that say something
// about the collectives (the malloc and page-fault ones do not).
const std::vector<std::pair<std::string, std::vector<std::string>>> kScenarios = {
    {"Gradients", {"grads", "--steps", "20"}},
    {"SkewedInitialWeights", {"grads", "--skew", "1", "--steps", "3"}},
    {"SeveralBucketsAndRebuild",
     {"grads", "--bucket-cap-mb", "0.002", "--first-bucket-mb", "0.001", "--min-buckets", "3", "--steps", "5"}},
    {"RebuildReorders",
     {"grads", "--reversed", "1", "--bucket-cap-mb", "0.002", "--first-bucket-mb", "0.001", "--min-buckets", "3",
      "--steps", "5"}},
    {"CopiedGradients", {"grads", "--as-view", "0", "--bucket-cap-mb", "0.002", "--steps", "4"}},
    {"MixedFloatAndDouble", {"grads", "--mixed", "1", "--steps", "4", "--min-buckets", "2"}},
    {"BatchNormBuffers", {"batchnorm"}},
    {"UnusedEverywhere", {"unused", "--mode", "none"}},
    {"UsedOnlyOnRankZero", {"unused", "--mode", "rank0"}},
    {"UnusedWithoutFindUnusedIsAnError", {"unused", "--mode", "error"}},
    {"NoSync", {"no_sync"}},
    {"NoSyncBranch", {"no_sync", "--unused-branch", "1"}},
    {"DifferentModels", {"mismatch", "--timeout", "60"}},
    {"SetToNone",
     {"grads", "--set-to-none", "1", "--bucket-cap-mb", "0.002", "--first-bucket-mb", "0.001", "--steps", "5"}},
    {"TiedSequential", {"tied", "--shape", "sequential"}},
    {"TiedEmbedding", {"tied", "--shape", "embedding"}},
    {"UndefinedGradOnOneRank", {"undefined_grad", "--timeout", "30"}},
    {"Reentrant", {"reentrant", "--timeout", "30"}},
    {"FailedBackward", {"failed_backward", "--timeout", "30"}},
    {"BuffersOnce", {"buffers_once"}},
};

class MpiDDPWorld : public ::testing::TestWithParam<int> {};

}  // namespace

// Every scenario in one mpirun (ddp_worker's "--then"): one process start a
// world size, not one a scenario. A failure names its scenario in the
// ranks' output ("scenario k of n").
TEST_P(MpiDDPWorld, EveryScenarioPassesOverTheMpiBackend) {
  SKIP_WITHOUT_MPI();
  std::vector<std::string> args;
  for (const auto& [name, scenario_args] : kScenarios) {
    if (!args.empty()) args.push_back("--then");
    args.insert(args.end(), scenario_args.begin(), scenario_args.end());
  }
  auto r = run_mpirun(GetParam(), DDP_WORKER, args, {{"DDP_TEST_BACKEND", "mpi"}}, std::chrono::seconds(480));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
}

INSTANTIATE_TEST_SUITE_P(Ranks, MpiDDPWorld, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// Rank 1 never starts rank 0's all-reduce: rank 0 fails within the group's
// 2 s timeout with the error (the worker checks its words), and the job
// ends instead of hanging: rank 0 exits without MPI_Finalize (a pending
// collective would block it), so mpirun ends the job and reports it.
TEST(MpiTimeout, ACollectiveOneRankNeverJoinsFailsWithinTheTimeout) {
  SKIP_WITHOUT_MPI();
  auto r = run_mpirun(2, DDP_WORKER, {"straggler", "--timeout", "2"}, {{"DDP_TEST_BACKEND", "mpi"}},
                      std::chrono::seconds(90));
  EXPECT_FALSE(r.killed_at_deadline) << describe(r);
  EXPECT_NE(r.ranks[0].find("caught: rank 0: mpi allreduce failed: not finished within the timeout of 2000 ms"),
            std::string::npos)
      << describe(r);
  EXPECT_EQ(r.ranks[0].find("FAILED"), std::string::npos) << describe(r);
}

// Under mpirun on one node, Gloo needs no MASTER_ADDR either (loopback).
// MASTER_PORT is a reserved one (multiprocess.h): the port a job id gives,
// one of 15000 (launch_env.h), may be another job's, such as this test's in
// the other build running at once; mpi_netns_test.cpp runs without
// MASTER_PORT, in network namespaces of its own.
TEST(MpiLaunch, GlooUnderMpirunOnOneNode) {
  SKIP_WITHOUT_MPI();
  auto r = run_mpirun(2, DDP_TRAIN_CHECK, {"--backend", "gloo"}, {{"MASTER_PORT", std::to_string(free_port())}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.ranks[1].find("rank 1/2: openmpi ok"), std::string::npos) << describe(r);
}
