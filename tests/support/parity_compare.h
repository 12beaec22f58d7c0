// What the tests that hold libddp to PyTorch bitwise share
// (pytorch_parity_test.cpp, join_test.cpp, powersgd_hook_test.cpp): whether
// /usr/bin/python3 has the torch a script needs, the case list both sides
// are given, and the tally of our <dir>/cpp_<name> against PyTorch's
// <dir>/torch_<name>, raw float32 compared value by value.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "multiprocess.h"

namespace ddp::testing {

// {"a", "b"} as "a,b": the --cases of ddp_worker and the scripts' argument.
inline std::string join_commas(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& c : items) out += (out.empty() ? "" : ",") + c;
  return out;
}

// The Python whose torch the parity tests compare with (tests/CMakeLists.txt).
#ifndef DDP_ORACLE_PYTHON
#define DDP_ORACLE_PYTHON "/usr/bin/python3"
#endif
inline const char* oracle_python() { return DDP_ORACLE_PYTHON; }

// Whether the oracle Python has the packages of `modules` (comma-separated,
// "torch.distributed, numpy"), so a machine without python3-torch skips
// rather than fails. Found, not imported: importing torch costs 1.4 s (1.13)
// to 2.5 s (2.11) of CPU, once more per test; a torch that is found but
// cannot import fails the test, which then says why.
inline bool have_pytorch(const std::string& modules) {
  std::string packages;
  std::stringstream list(modules);
  for (std::string item; std::getline(list, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    packages += (packages.empty() ? "'" : ", '") + item.substr(0, item.find('.')) + "'";
  }
  const std::string check = "import importlib.util, sys; "
                            "sys.exit(any(importlib.util.find_spec(p) is None for p in [" + packages + "]))";
  return std::system((std::string(oracle_python()) + " -c \"" + check + "\" >/dev/null 2>&1").c_str()) == 0;
}

// The oracle's torch version as major * 100 + minor (113 for 1.13, 211 for
// 2.11), 0 when it cannot say; from the package's metadata, without
// importing torch.
inline int oracle_torch_version() {
  const std::string cmd = std::string(oracle_python()) +
                          " -c 'import importlib.metadata as m; v = m.version(\"torch\").split(\"+\")[0].split(\".\"); "
                          "print(int(v[0]) * 100 + int(v[1]))' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return 0;
  int v = 0;
  if (std::fscanf(p, "%d", &v) != 1) v = 0;
  ::pclose(p);
  return v;
}

// How our float32 outputs differ from PyTorch's, over every file added.
struct FloatDiff {
  size_t total = 0;            // values compared
  size_t differing = 0;        // values whose bits differ
  double worst = 0;            // the largest |ours - theirs|
  double worst_relative = 0;   // the largest |ours - theirs| / max(1e-3, |theirs|)

  // Adds <dir>/cpp_<name> against <dir>/torch_<name>. A size mismatch or an
  // empty file is a fatal failure: wrap the call in ASSERT_NO_FATAL_FAILURE.
  void add(const std::string& dir, const std::string& name) {
    const auto a = read_file(dir + "/cpp_" + name), b = read_file(dir + "/torch_" + name);
    ASSERT_EQ(a.size(), b.size()) << name;
    ASSERT_GT(a.size(), 0u) << name;
    for (size_t i = 0; i + sizeof(float) <= a.size(); i += sizeof(float)) {
      float x, y;
      std::memcpy(&x, a.data() + i, sizeof x);
      std::memcpy(&y, b.data() + i, sizeof y);
      // Bitwise: the same float, not merely close.
      if (std::memcmp(&x, &y, sizeof x) != 0) ++differing;
      const double d = std::abs(double(x) - double(y));
      worst = std::max(worst, d);
      worst_relative = std::max(worst_relative, d / std::max(1e-3, std::abs(double(y))));
      ++total;
    }
  }
};

}  // namespace ddp::testing
