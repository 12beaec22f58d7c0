// ddprun and Python programs: the interpreter chosen for a .py PROGRAM or
// --module (one that has torch), and the error it names when none has.

#include "../support/located.h"
#include "launcher_test_util.h"

namespace ddprun_test {
namespace {

using Launcher = LauncherTest;


bool system_python_has_torch(const std::string& dir) {
  if (::access("/usr/bin/python3", X_OK) != 0) return false;
  // Found, not imported: the test's own runs import it.
  return Process({"/usr/bin/python3", "-c",
                  "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"},
                 {}, dir)
             .wait(120)
             .code == 0;
}

// A python3 without torch first on PATH (a pyenv shim, a virtual
// environment): the script runs with the next candidate that has torch.
class PythonLauncher : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    bin_ = sub("bin");
    fake_ = bin_ + "/python3";
    std::ofstream(fake_) << "#!/bin/sh\nif [ \"$1\" = -c ]; then\n  echo \"ModuleNotFoundError: No module named "
                            "'torch'\" >&2\n  exit 1\nfi\necho fake python \"$@\"\n";
    fs::permissions(fake_, fs::perms::owner_all);
    script_ = dir_ + "/which_python.py";
    std::ofstream(script_) << "import os, sys, torch\nprint('interpreter', sys.executable, 'rank', os.environ['RANK'])\n";
    const char* path = std::getenv("PATH");
    path_ = bin_ + ":" + (path ? path : "/usr/bin:/bin");
  }
  std::string bin_, fake_, script_, path_;
};

TEST_F(PythonLauncher, ScriptRunsWithAnInterpreterThatHasTorch) {
  if (!system_python_has_torch(dir_)) GTEST_SKIP() << "/usr/bin/python3 cannot import torch on this machine";
  std::string port = std::to_string(free_port());
  Result r = Process({DDPRUN_BIN, "--nproc-per-node", "2", "--master-port", port, script_}, {{"PATH", path_}}, dir_)
                 .wait();
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "interpreter /usr/bin/python3 rank"), 2) << r.out;
  EXPECT_NE(r.err.find("running the Python script with /usr/bin/python3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("python3 on PATH (" + fake_ + "): exit code 1: ModuleNotFoundError"), std::string::npos)
      << r.err;

  // --module looks the same way.
  std::ofstream(dir_ + "/which_module.py") << "import sys, torch\nprint('module under', sys.executable)\n";
  Result m = Process({DDPRUN_BIN, "--master-port", port, "-m", "which_module"},
                     {{"PATH", path_}, {"PYTHONPATH", dir_}}, dir_)
                 .wait();
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_NE(m.out.find("module under /usr/bin/python3"), std::string::npos) << m.out;

  // PYTHON_EXEC wins unasked, as in torchrun; --no-python runs the script itself.
  Result exec = Process({DDPRUN_BIN, "--master-port", port, script_}, {{"PATH", path_}, {"PYTHON_EXEC", fake_}}, dir_)
                    .wait();
  ASSERT_EQ(exec.code, 0) << exec.err;
  EXPECT_NE(exec.out.find("fake python -u " + script_), std::string::npos) << exec.out;
  EXPECT_EQ(exec.err.find("running the Python script with"), std::string::npos) << exec.err;
}

// torchrun's own writer (@record) and ddprun's reader agree on the shape.
TEST_F(PythonLauncher, ARecordedPythonErrorShowsItsTracebackInTheSummary) {
  if (!system_python_has_torch(dir_)) GTEST_SKIP() << "/usr/bin/python3 cannot import torch on this machine";
  std::string script = dir_ + "/recorded.py";
  std::ofstream(script) << "from torch.distributed.elastic.multiprocessing.errors import record\n"
                           "@record\ndef main():\n    raise ValueError('bad batch size')\nmain()\n";
  Result r = Process({DDPRUN_BIN, "--master-port", std::to_string(free_port()), script},
                     {{"PYTHON_EXEC", "/usr/bin/python3"}}, dir_)
                 .wait();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("  traceback : Traceback (most recent call last):\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n    ValueError: bad batch size\n"), std::string::npos) << r.err;
}

TEST_F(PythonLauncher, NoInterpreterWithTorchIsAnErrorNamingEachOneTried) {
  if (system_python_has_torch(dir_))
    GTEST_SKIP() << "/usr/bin/python3 has torch here (ddprun_unit_tests' PythonChoiceTest covers this case)";
  Result r = Process({DDPRUN_BIN, script_}, {{"PATH", bin_ + ":/nonexistent"}}, dir_).wait();
  expect_one_error_line(r, 1, "python3 on PATH (" + fake_ + "): exit code 1: ModuleNotFoundError");
  EXPECT_NE(r.err.find("PYTHON_EXEC=/path/to/python3"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ddprun_test
