// Options refuse values that cannot work where they are set, with a
// ddp::UsageError, before any process group or collective exists.
#include <gtest/gtest.h>

#include "ddp/parallel/ddp_options.h"
#include "ddp/comm/process_group.h"

TEST(DistributedDataParallelOptions, ZeroOrNegativeBucketIsAUsageErrorWhereItIsSet) {
  EXPECT_THROW(ddp::DistributedDataParallelOptions().bucket_cap_mb(0), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedDataParallelOptions().bucket_cap_mb(-1), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedDataParallelOptions().first_bucket_mb(-0.5), ddp::UsageError);
  EXPECT_THROW(ddp::DistributedDataParallelOptions().bucket_cap_mb(std::nan("")), ddp::UsageError);
  try {
    ddp::DDPOptions().bucket_cap_mb(0);
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket_cap_mb"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(ddp::DistributedDataParallelOptions().bucket_cap_mb(0.5).bucket_cap_mb(), 0.5);
  EXPECT_DOUBLE_EQ(ddp::DDPOptions().bucket_cap_mb(), 25.0);  // PyTorch's default
}

TEST(ProcessGroupOptions, UnknownBackendZeroTimeoutAndUnknownInitMethodAreUsageErrors) {
  EXPECT_THROW(ddp::ProcessGroupOptions().backend("glooo"), ddp::UsageError);
  EXPECT_THROW(ddp::ProcessGroupOptions().timeout(std::chrono::milliseconds(0)), ddp::UsageError);
  EXPECT_THROW(ddp::ProcessGroupOptions().init_method("file:///tmp/x"), ddp::UsageError);
  EXPECT_NO_THROW(ddp::ProcessGroupOptions().backend("gloo").init_method("tcp://127.0.0.1:29500"));
  EXPECT_EQ(ddp::ProcessGroupOptions().timeout(), std::chrono::minutes(30));  // PyTorch's default
}

TEST(ProcessGroupOptions, BadPortInInitMethodIsAUsageErrorBeforeAnyConnection) {
  auto options = ddp::ProcessGroupOptions().backend("gloo").init_method("tcp://127.0.0.1:99999");
  EXPECT_THROW(ddp::init_process_group(ddp::LaunchEnv{}, options), ddp::UsageError);
}
