// Which Python runs a .py PROGRAM or a --module. torchrun runs the script
// with its own interpreter (sys.executable), which has torch by definition;
// ddprun has no interpreter of its own, and the first python3 on PATH may be
// one without torch (a pyenv shim, a virtual environment), so it asks each
// candidate once, at start-up, whether it can import torch.
#pragma once

#include <string>
#include <vector>

namespace ddprun {

struct PythonChoice {
  std::string path;  // the interpreter the workers run
  std::string note;  // for the log when it is not the first python3 on PATH; else empty
};

// How long one candidate may take to `import torch` (a cold import on a busy
// node takes seconds).
constexpr double kPythonCheckTimeout = 60;

// The first of python3 on `path`, /usr/bin/python3 and python on `path` that
// runs `CANDIDATE -c "import torch"` (fork + exec, no shell, ddprun's
// environment) to exit 0 within `timeout_s` seconds; a candidate that is the
// same file as one already tried is skipped. PYTHON_EXEC, when set, is used
// instead without asking (the caller's business, as in torchrun). Throws
// LaunchError naming every interpreter tried and what each said, and how to
// choose one (PYTHON_EXEC=/path/to/python3).
PythonChoice choose_python(const std::string& path, double timeout_s);

// The same over other candidates (names are looked up in `path`, paths taken
// as they are), for tests.
PythonChoice choose_python(const std::string& path, double timeout_s, const std::vector<std::string>& candidates);

}  // namespace ddprun
