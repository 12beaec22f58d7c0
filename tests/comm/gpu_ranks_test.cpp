// Which GPU an NCCL rank takes, and the refusal of more ranks on a node than
// it has GPUs (src/comm/backend/gpu_ranks.h): any count, on a machine with or
// without GPUs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "comm/backend/gpu_ranks.h"

namespace {

ddp::LaunchEnv node(int local_rank, int local_world_size,
                    ddp::LaunchEnv::Source source = ddp::LaunchEnv::Source::Torchrun) {
  ddp::LaunchEnv env;
  env.local_rank = local_rank;
  env.local_world_size = local_world_size;
  env.source = source;
  return env;
}

// CUDA_VISIBLE_DEVICES as a test wants it, restored after.
struct VisibleDevices {
  explicit VisibleDevices(const char* value) {
    if (const char* old = std::getenv("CUDA_VISIBLE_DEVICES")) saved = old;
    if (value) ::setenv("CUDA_VISIBLE_DEVICES", value, 1);
    else ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
  ~VisibleDevices() {
    if (saved) ::setenv("CUDA_VISIBLE_DEVICES", saved->c_str(), 1);
    else ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
  std::optional<std::string> saved;
};

std::string refusal(const ddp::LaunchEnv& env, int gpus, const std::string& backend) {
  try {
    ddp::detail::gpu_of_rank(env, gpus, backend, "rank 1: init_process_group: ");
  } catch (const ddp::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(GpuRanks, EachRankTakesTheGpuOfItsLocalRank) {
  EXPECT_EQ(ddp::detail::gpu_of_rank(node(0, 1), 1, "nccl", ""), 0);
  EXPECT_EQ(ddp::detail::gpu_of_rank(node(3, 4), 8, "nccl", ""), 3);
  EXPECT_EQ(ddp::detail::gpu_of_rank(node(1, 2), 2, "auto", ""), 1);
}

TEST(GpuRanks, MoreRanksThanGpusAreRefusedOnEveryRankNamingBothWaysOut) {
  VisibleDevices unset(nullptr);
  for (int local_rank : {0, 1}) {
    const std::string why = refusal(node(local_rank, 2), 1, "nccl");
    ASSERT_FALSE(why.empty()) << "local rank " << local_rank;
    EXPECT_EQ(why.rfind("rank 1: init_process_group: the nccl backend", 0), 0u) << why;
    EXPECT_NE(why.find("this node has 2 ranks"), std::string::npos) << why;
    EXPECT_NE(why.find("for the 1 GPU this process sees"), std::string::npos) << why;
    EXPECT_NE(why.find("ddprun --nproc-per-node gpu"), std::string::npos) << why;
    EXPECT_NE(why.find("--backend gloo"), std::string::npos) << why;
  }
  EXPECT_NE(refusal(node(0, 3), 2, "auto").find("the auto backend chose nccl"), std::string::npos);
}

// Under mpirun or Slurm the node's rank count may be unknown (1): a
// LOCAL_RANK without a GPU of its own is refused all the same.
TEST(GpuRanks, ALocalRankBeyondTheVisibleGpusIsRefused) {
  VisibleDevices unset(nullptr);
  const std::string why = refusal(node(2, 1, ddp::LaunchEnv::Source::Slurm), 2, "nccl");
  EXPECT_NE(why.find("this node has 3 ranks (LOCAL_RANK 2 of 3"), std::string::npos) << why;
  EXPECT_NE(why.find("2 GPUs"), std::string::npos) << why;
}

// ddprun and torchrun start a node's ranks with one environment: a
// CUDA_VISIBLE_DEVICES there is every rank's, and two ranks on its one GPU
// are refused. Slurm's --gpus-per-task gives each task a GPU of its own
// through CUDA_VISIBLE_DEVICES: four tasks seeing one GPU each all run.
TEST(GpuRanks, AGpuOfItsOwnPerTaskUnderSlurmOrMpirunIsTaken) {
  VisibleDevices one("0");
  EXPECT_FALSE(refusal(node(1, 2), 1, "nccl").empty()) << "ddprun: one environment for the node";
  for (auto source : {ddp::LaunchEnv::Source::Slurm, ddp::LaunchEnv::Source::OpenMPI})
    for (int local_rank = 0; local_rank < 4; ++local_rank)
      EXPECT_EQ(ddp::detail::gpu_of_rank(node(local_rank, 4, source), 1, "nccl", ""), 0);
}

}  // namespace
