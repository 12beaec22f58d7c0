#include "python.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "cli.h"
#include "errors.h"
#include "fd.h"
#include "wait.h"
#include "worker_process.h"

extern char** environ;

namespace ddprun {
namespace {

// What an interpreter said: "" if it imported torch, else why not.
std::string torch_import_problem(const std::string& interpreter, double timeout_s) {
  Pipe out = make_pipe();
  UniqueFd out_copy(::dup(out.write.get()));
  if (!out_copy) throw LaunchError(std::string("cannot run ") + interpreter + ": out of file descriptors");
  WorkerSpec spec;
  spec.argv = {interpreter, "-c", "import torch"};
  for (char** e = environ; *e; ++e) spec.env.push_back(*e);
  sigset_t none;
  sigemptyset(&none);  // ddprun blocks its signals; the check runs like any program
  spec.signal_mask = &none;
  std::unique_ptr<WorkerProcess> started;
  try {
    started = std::make_unique<WorkerProcess>(spec, std::move(out.write), std::move(out_copy));
  } catch (const LaunchError& e) {
    return e.what();  // "cannot execute ...: Permission denied"
  }
  WorkerProcess& check = *started;  // killed and reaped on every way out
  set_nonblocking(out.read.get());

  std::string said;
  auto read_some = [&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out.read.get(), buf, sizeof buf)) > 0) {
      said.append(buf, static_cast<size_t>(n));
      if (said.size() > 16384) said.erase(0, said.size() - 8192);  // the last lines tell
    }
  };
  const auto deadline = Clock::now() + seconds(timeout_s);
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(check.pid(), &status, WNOHANG);
    if (r == check.pid()) break;
    if (Clock::now() >= deadline)
      return "did not finish `import torch` within " + std::to_string(static_cast<int>(timeout_s)) + " s";
    pollfd p{out.read.get(), POLLIN, 0};
    ::poll(&p, 1, 50);
    read_some();
  }
  check.set_exit_status(status);
  read_some();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  // The last non-empty line: "ModuleNotFoundError: No module named 'torch'".
  std::string last;
  size_t end = said.size();
  while (end > 0) {
    size_t start = said.rfind('\n', end - 1);
    start = start == std::string::npos ? 0 : start + 1;
    last = said.substr(start, end - start);
    if (last.find_first_not_of(" \t\r") != std::string::npos) break;
    last.clear();
    end = start > 0 ? start - 1 : 0;
  }
  for (char& c : last)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  if (last.size() > 300) last = last.substr(0, 300) + "...";
  return describe_status(status) + (last.empty() ? "" : ": " + last);
}

}  // namespace

PythonChoice choose_python(const std::string& path, double timeout_s) {
  return choose_python(path, timeout_s, {"python3", "/usr/bin/python3", "python"});
}

PythonChoice choose_python(const std::string& path, double timeout_s, const std::vector<std::string>& names) {
  struct Candidate {
    std::string label;
    std::optional<std::string> file;
  };
  std::vector<Candidate> candidates;
  for (const auto& n : names)
    candidates.push_back({n.find('/') == std::string::npos ? n + " on PATH" : n, find_program(n, path)});
  std::vector<std::string> tried;
  std::set<std::string> seen;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (!c.file) {
      tried.push_back(c.label + ": not found");
      continue;
    }
    char* real = ::realpath(c.file->c_str(), nullptr);
    std::string identity = real ? real : *c.file;
    ::free(real);
    // A shim (pyenv) resolves to itself, not to the Python it would run: two
    // shims are still one candidate each, and only identical files are skipped.
    if (!seen.insert(identity).second) continue;
    std::string problem = torch_import_problem(*c.file, timeout_s);
    const std::string name = c.label == *c.file ? *c.file : c.label + " (" + *c.file + ")";
    if (problem.empty()) {
      PythonChoice choice{*c.file, ""};
      if (i > 0)
        choice.note = "running the Python script with " + name + ", which has torch; " + tried.front() +
                      " (set PYTHON_EXEC to choose the interpreter)";
      return choice;
    }
    tried.push_back(name + ": " + problem);
  }
  std::string list;
  for (const auto& t : tried) list += (list.empty() ? "" : "; ") + t;
  throw LaunchError("no Python interpreter that can import torch to run the script: " + list +
                    ". Set PYTHON_EXEC=/path/to/python3 to an interpreter with torch, or run PROGRAM as it is "
                    "with --no-python");
}

}  // namespace ddprun
