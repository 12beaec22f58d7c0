// The environment summary's versions, on a one-rank group of its own.
#include <gtest/gtest.h>

#include "ddp/train/env_summary.h"

namespace {

// One rank, no communication: the summary's allgather returns its input.
class SoloGroup final : public ddp::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend_name() const override { return "solo"; }
  torch::Device device() const override { return torch::kCPU; }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(1); }
  ddp::Work allreduce(at::Tensor&) override { return {}; }
  ddp::Work broadcast(at::Tensor&, int) override { return {}; }
  std::vector<at::Tensor> allgather(const at::Tensor& t) override { return {t.clone()}; }
  void barrier() override {}
};

}  // namespace

TEST(EnvironmentSummary, NamesTheMpiLibraryInBuildsWithTheMpiBackend) {
  SoloGroup pg;
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
