// The environment summary's versions, on a one-rank group of its own.
#include <gtest/gtest.h>

#include "ddp/train/env_summary.h"

#include "../support/fake_process_group.h"

TEST(EnvironmentSummary, NamesTheMpiLibraryInBuildsWithTheMpiBackend) {
  ddp::testing::FakeGroup pg;  // one rank: the summary's allgather returns its input
  const std::string summary = ddp::environment_summary(pg);
  EXPECT_NE(summary.find("LibTorch "), std::string::npos) << summary;
  const std::string mpi = ddp::mpi_library_version();
#ifdef DDP_WITH_MPI_BUILT
  ASSERT_FALSE(mpi.empty()) << "this build has the mpi backend, but mpi_library_version() is empty";
  EXPECT_NE(summary.find("  MPI: " + mpi + "\n"), std::string::npos) << summary;
#else
  EXPECT_EQ(mpi, "");
  EXPECT_EQ(summary.find("MPI:"), std::string::npos) << summary;
#endif
}
