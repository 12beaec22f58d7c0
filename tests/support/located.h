// Where a test finds the build's programs and the tree's scripts. The
// compile command names each path relative to the build's top folder
// (ddp_test_paths in tests/CMakeLists.txt), and the running program turns it
// into a full path from its own place in the build: no compile command names
// the checkout, so a fresh clone's build hits the ccache entries another
// clone left, and a build tree copied elsewhere with its source tree beside
// it (the GPU kit) finds its files.
#pragma once

#include <unistd.h>

#include <climits>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

// DDP_TEST_BUILD_ROOT comes with the paths, from ddp_test_paths.
#ifdef DDP_TEST_BUILD_ROOT
namespace ddp::testing {

// The build's top folder: DDP_TEST_BUILD_ROOT is its path relative to the
// folder of the running program.
inline const std::filesystem::path& build_root() {
  static const std::filesystem::path root = [] {
    char exe[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) throw std::runtime_error("located: cannot read /proc/self/exe");
    return (std::filesystem::path(std::string(exe, static_cast<size_t>(n))).parent_path() / DDP_TEST_BUILD_ROOT)
        .lexically_normal();
  }();
  return root;
}

// The full path of a file named relative to the build's top folder; the
// returned string lives as long as the program.
inline const char* located(const char* from_build_root) {
  static std::mutex mutex;
  static std::map<std::string, std::string> paths;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = paths.try_emplace(from_build_root);
  if (fresh) it->second = (build_root() / from_build_root).lexically_normal().string();
  return it->second.c_str();
}

}  // namespace ddp::testing
#endif
