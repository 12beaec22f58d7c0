// What the tests that check our files from Python share: whether
// /usr/bin/python3 has torch, and a command's output (stdout and stderr),
// prefixed "FAILED(status): " when it exits non-zero.
#pragma once

#include <cstdio>
#include <string>

namespace ddp::testing {

// Found, not imported (an import of torch costs more than most checks);
// asked once per process.
inline bool python_torch() {
  static const bool has = [] {
    FILE* p = ::popen("/usr/bin/python3 -c 'import importlib.util, sys; "
                      "sys.exit(importlib.util.find_spec(\"torch\") is None)' 2>/dev/null",
                      "r");
    return p && ::pclose(p) == 0;
  }();
  return has;
}

inline std::string run(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t k = std::fread(buf, 1, sizeof buf, p)) out.append(buf, k);
  const int rc = ::pclose(p);
  if (rc != 0) out = "FAILED(" + std::to_string(rc) + "): " + out;
  return out;
}

}  // namespace ddp::testing
