// Two jobs that share a node must never meet: each takes its default port
// from its job id, and a rank that reaches another job's rendezvous store is
// refused at once, naming both jobs. The two "jobs" here are two threads of
// this process, each with its own launch environment.
#include <gtest/gtest.h>

#include <future>
#include <string>

#include "ddp/runtime/launch_env.h"
#include "ddp/comm/process_group.h"
#include "../support/multiprocess.h"

namespace {

ddp::LaunchEnv rank_of_job(int rank, const std::string& job, int port) {
  ddp::LaunchEnv env;
  env.rank = rank;
  env.world_size = 2;
  env.local_rank = rank;
  env.local_world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = static_cast<uint16_t>(port);
  env.source = ddp::LaunchEnv::Source::Slurm;
  env.job_id = job;
  return env;
}

}  // namespace

TEST(JobIdentity, DefaultPortsDifferByJob) {
  EXPECT_EQ(ddp::default_port_for_job(""), 29500);
  const auto a = ddp::default_port_for_job("slurm:1001.0"), b = ddp::default_port_for_job("slurm:1002.0");
  EXPECT_NE(a, b);
  EXPECT_EQ(a, ddp::default_port_for_job("slurm:1001.0"));  // every rank of a job agrees
  for (uint16_t p : {a, b}) {
    EXPECT_GE(p, 15000);
    EXPECT_LT(p, 30000);
  }
}

TEST(JobIdentity, ARankOfAnotherJobIsRefusedAtOnce) {
  const int port = ddp::testing::free_port();
  const auto options = ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(5));
  // Rank 0 of job 1001 serves the store; rank 1 of job 1002 reaches it.
  auto first = std::async(std::launch::async, [&] {
    try {
      ddp::init_process_group(rank_of_job(0, "slurm:1001.0", port), options);
      return std::string("joined");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  });
  std::string refused;
  try {
    ddp::init_process_group(rank_of_job(1, "slurm:1002.0", port), options);
  } catch (const ddp::CommError& e) {
    refused = e.what();
  }
  EXPECT_NE(refused.find("belongs to job slurm:1001.0"), std::string::npos) << refused;
  EXPECT_NE(refused.find("slurm:1002.0"), std::string::npos) << refused;
  EXPECT_EQ(refused.rfind("rank 1", 0), 0u) << refused;
  // Rank 0 waits for a peer of its own job that never comes, until its timeout.
  EXPECT_NE(first.get(), "joined");
}
