// Fuzzes ddprun's command line and --rdzv-conf (launcher/cli.cpp): each line
// of the bytes is one argument after "ddprun", except lines "@NAME=VALUE",
// which set an environment variable for the parse (PET_*, SLURM_*,
// DDPRUN_TERM_TIMEOUT). A bad command line must be a UsageError or a
// LaunchError; anything else is a finding. The durations it accepts are
// turned into deadlines as the agent and the rendezvous do. Run: fuzz/README.md.
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "errors.h"
#include "fuzz_input.h"
#include "wait.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A .py PROGRAM or --module would look for a Python with torch (seconds):
  // name one that exists and returns at once.
  ::setenv("PYTHON_EXEC", "/bin/true", 1);
  for (const char* name : {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES",
                           "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_LOCALID",
                           "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
                           "DDPRUN_TERM_TIMEOUT"})
    ::unsetenv(name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"ddprun"};
  // Variables the input sets, with the values to put back afterwards.
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const auto& line : ddp::fuzz::lines(data, size)) {
    const auto eq = line.find('=');
    if (line.size() > 1 && line[0] == '@' && eq != std::string::npos && eq > 1 &&
        line.find('\0') == std::string::npos) {
      const std::string name = line.substr(1, eq - 1);
      const char* old = std::getenv(name.c_str());
      saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(name.c_str(), line.c_str() + eq + 1, 1);
    } else {
      args.push_back(line);
    }
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  std::ostringstream out;
  try {
    if (auto o = ddprun::parse_command_line(static_cast<int>(args.size()), argv.data(), out)) {
      const auto& c = o->rdzv_conf;
      for (double s : {o->monitor_interval, o->term_timeout, c.join_timeout, c.last_call_timeout, c.close_timeout,
                       c.keep_alive_interval, c.keep_alive_interval * c.keep_alive_max_attempt})
        (void)(ddprun::Clock::now() + ddprun::seconds(s));
    }
  } catch (const ddprun::UsageError&) {
  } catch (const ddprun::LaunchError&) {
  }
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
    else ::unsetenv(it->first.c_str());
  }
  return 0;
}
