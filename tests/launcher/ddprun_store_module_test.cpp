// ddprun's store module (launcher/store_module.h): a one-node run loads no
// LibTorch, a run on a store loads the module, and a ddprun whose module is
// missing or broken stops such a run saying where it looked, while it still
// runs one node.
#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using StoreModule = LauncherTest;

// A worker that exits 0 when its parent, ddprun, has `library` mapped
// (`mapped`), or has not (!`mapped`).
std::vector<std::string> parent_maps(const std::string& library, bool mapped) {
  return {"/bin/sh", "-c", std::string(mapped ? "" : "! ") + "grep -q '/" + library + "' /proc/$PPID/maps"};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// One node of a c10d group: a rendezvous on a store, with no other node.
std::vector<std::string> on_a_store(const std::string& ddprun) {
  return {ddprun, "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
          "127.0.0.1:" + std::to_string(free_port()), "--nproc-per-node", "1"};
}

TEST_F(StoreModule, AOneNodeRunLoadsNoLibTorch) {
  for (auto flags : {std::vector<std::string>{DDPRUN_BIN, "--standalone", "--nproc-per-node", "2"},
                     std::vector<std::string>{DDPRUN_BIN, "--master-port", std::to_string(free_port())}}) {
    Result r = Process(flags + parent_maps("libc10.so", false), {}, dir_).wait();
    EXPECT_EQ(r.code, 0) << flags[1] << ": ddprun has LibTorch loaded\n" << r.err;
  }
}

TEST_F(StoreModule, ARunOnAStoreLoadsTheModuleBesideDdprun) {
  Result r = Process(on_a_store(DDPRUN_BIN) + parent_maps("ddprun-store.so", true), {}, dir_).wait();
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(StoreModule, WithoutItsModuleARunOnAStoreStopsSayingWhereItLookedAndOneNodeStillRuns) {
  const std::string bin = sub("bin");
  const std::string ddprun = bin + "/ddprun";
  fs::copy_file(DDPRUN_BIN, ddprun);
  Result r = Process(on_a_store(ddprun) + std::vector<std::string>{"true"}, {}, dir_).wait();
  expect_one_error_line(r, 1, "store module ddprun-store.so");
  EXPECT_NE(r.err.find(bin + "/ddprun-store.so"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--standalone"), std::string::npos) << r.err;

  // Not a module at all: refused when loaded, with the loader's reason.
  std::ofstream(bin + "/ddprun-store.so") << "not a shared object\n";
  r = Process(on_a_store(ddprun) + std::vector<std::string>{"true"}, {}, dir_).wait();
  expect_one_error_line(r, 1, "cannot load ddprun's store module " + bin + "/ddprun-store.so");

  r = Process({ddprun, "--standalone", "--nproc-per-node", "1", "true"}, {}, dir_).wait();
  EXPECT_EQ(r.code, 0) << r.err;
}

}  // namespace
}  // namespace ddprun_test
