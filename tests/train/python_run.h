// What the tests that check our files from Python share: whether
// /usr/bin/python3 has torch, the Python that has tensorboard, and a
// command's output (stdout and stderr), prefixed "FAILED(status): " when it
// exits non-zero.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

// The Python with tensorboard (and torch 2.x): DDP_TENSORBOARD_PYTHON, else
// the torch 2.x environment's (deploy/install-torch2.sh). Empty, with why, if none.
inline std::string tensorboard_python(std::string& why) {
  std::string py;
  if (const char* p = std::getenv("DDP_TENSORBOARD_PYTHON")) py = p;
  else if (const char* v = std::getenv("DDP_TORCH2_VENV")) py = std::string(v) + "/bin/python";
  else if (const char* h = std::getenv("HOME")) py = std::string(h) + "/.cache/libddp/torch2/bin/python";
  if (py.empty() || ::access(py.c_str(), X_OK) != 0) {
    why = "no Python with tensorboard at " + (py.empty() ? std::string("~/.cache/libddp/torch2") : py) +
          " (deploy/install-torch2.sh installs it; DDP_TENSORBOARD_PYTHON names another)";
    return "";
  }
  const auto out = run(py + " -c 'import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) "
                            "is None for m in (\"tensorboard\", \"torch\")))'");
  if (out.rfind("FAILED", 0) == 0) {
    why = py + " lacks tensorboard or torch (deploy/install-torch2.sh installs them)";
    return "";
  }
  return py;
}

}  // namespace ddp::testing
