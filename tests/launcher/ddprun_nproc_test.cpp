// More workers than a node can take: --nproc-per-node far beyond the machine
// is refused (DDPRUN_MAX_NPROC allows it), and a fork that fails at the
// process limit stops the workers already started and exits 1.
#include <cstring>

#include "../support/located.h"
#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;

TEST_F(Launcher, NprocFarBeyondTheMachineIsRefused) {
  Result r = run({"--standalone", "--nproc-per-node", "10000"}, {});
  expect_one_error_line(r, 2, "--nproc-per-node 10000");
  EXPECT_NE(r.err.find("DDPRUN_MAX_NPROC=10000"), std::string::npos) << r.err;
}

// A user id of this test process's own (1000000 + its pid), for the limit
// below: RLIMIT_NPROC counts every process of the real user id, so another
// test as the same user (this one in the other build, run at the same
// moment) would count against it. nobody's (65534) where this user
// namespace does not map that id.
std::string own_user_id() {
  const unsigned long id = 1000000ul + static_cast<unsigned long>(::getpid());
  std::ifstream map("/proc/self/uid_map");
  unsigned long inside = 0, outside = 0, count = 0;
  while (map >> inside >> outside >> count)
    if (id >= inside && id - inside < count) return std::to_string(id);
  return "65534";
}

// RLIMIT_NPROC as an unprivileged user (root's own limit is not enforced):
// the workers' forks fail with EAGAIN part-way through.
TEST_F(Launcher, AForkFailingAtTheProcessLimitStopsTheStartedWorkers) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root, to run ddprun as another user under a process limit";
  if (!fs::exists("/usr/bin/prlimit") || !fs::exists("/usr/bin/setpriv"))
    GTEST_SKIP() << "needs prlimit and setpriv (util-linux)";
  // ddprun, its watchdog and the first workers fit; the twelfth does not.
  const std::string limit = "--nproc=6", user = own_user_id();
  std::vector<std::string> argv{"/usr/bin/prlimit", limit, "/usr/bin/setpriv", "--reuid=" + user, "--regid=" + user,
                                "--clear-groups", DDPRUN_BIN, "--standalone", "--nproc-per-node", "12",
                                TEST_WORKER_BIN, "--sleep", "120"};
  Process p(argv, {{"TMPDIR", "/tmp"}}, dir_);
  Result r = p.wait(120);
  ASSERT_NE(r.code, -1) << "ddprun did not end; stderr:\n" << r.err;
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot start worker"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::strerror(EAGAIN)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ulimit -u"), std::string::npos) << r.err;
  // TearDown: no worker outlived ddprun.
}

}  // namespace
}  // namespace ddprun_test
