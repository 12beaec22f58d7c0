// ddp::dist's questions about the build, the launch and a group's members,
// which need no running group: torch.distributed's is_*_available(),
// is_torchelastic_launched() and get_process_group_ranks().
#include <gtest/gtest.h>

#include <cstdlib>

#include "ddp/comm/dist.h"
#include "ddp/errors.h"

namespace {

namespace dist = ddp::dist;

TEST(DistQueries, WhatThisBuildHas) {
  EXPECT_TRUE(dist::is_available());
  EXPECT_TRUE(dist::is_gloo_available());
#ifdef USE_C10D_NCCL
  EXPECT_TRUE(dist::is_nccl_available());
#else
  EXPECT_FALSE(dist::is_nccl_available());
#endif
  (void)dist::is_mpi_available();  // where CMake found MPI; the mpi tests use it
}

TEST(DistQueries, LaunchedByAnElasticAgentWhenItsRunIdIsSet) {
  const char* before = std::getenv("TORCHELASTIC_RUN_ID");
  const std::string kept = before ? before : "";
  ::unsetenv("TORCHELASTIC_RUN_ID");
  EXPECT_FALSE(dist::is_torchelastic_launched());
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);  // torchrun's and ddprun's value without --rdzv-id
  EXPECT_TRUE(dist::is_torchelastic_launched());
  if (before) ::setenv("TORCHELASTIC_RUN_ID", kept.c_str(), 1);
  else ::unsetenv("TORCHELASTIC_RUN_ID");
}

TEST(DistQueries, AGroupsRanksAreItsMembersGlobalRanks) {
  EXPECT_EQ(dist::get_process_group_ranks(dist::Group::of_ranks(nullptr, {0, 2, 5})), (std::vector<int>{0, 2, 5}));
  if (!ddp::is_initialized()) EXPECT_THROW(dist::get_process_group_ranks(dist::group::WORLD), ddp::UsageError);
}

}  // namespace
