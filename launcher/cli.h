// ddprun's command line: torchrun's flags (dash and underscore spellings,
// PET_* environment defaults as in torchrun), Slurm defaults, validation.
// Every problem becomes a UsageError (exit code 2) naming the flag and what
// to do about it.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace ddprun {

// Which standard streams a --redirects/--tee value selects, per local rank
// (torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both; "3" or "0:1,1:2").
struct StdSpec {
  static constexpr int kOut = 1;
  static constexpr int kErr = 2;
  int all = 0;
  std::map<int, int> per_rank;
  bool mapped = false;

  int of(int local_rank) const;
  // Throws UsageError naming `flag`.
  static StdSpec parse(const std::string& text, const std::string& flag);
};

// --rdzv-conf key=value pairs ddprun understands (seconds).
struct RdzvConf {
  double join_timeout = 600;         // torchrun's default
  double last_call_timeout = 30;     // torchrun's default
  double close_timeout = 30;         // how long the store host waits for others to leave
  double keep_alive_interval = 5;    // torchrun's default
  int keep_alive_max_attempt = 3;    // torchrun's default
  std::optional<bool> is_host;       // c10d: force hosting (true) or joining (false) the store
};

struct Options {
  // What each worker runs: command[0] is the resolved executable.
  std::vector<std::string> command;
  std::string program;  // as typed, for messages

  std::string nproc_spec = "1";
  int nproc = 1;
  std::string nproc_how;  // how "auto"/"gpu"/"cpu" was resolved, for the log

  int min_nodes = 1;
  int max_nodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string endpoint_host;  // empty: none given
  int endpoint_port = 0;
  std::string run_id = "none";
  RdzvConf rdzv_conf;
  std::string local_addr;

  int max_restarts = 0;
  // A worker that fails is reported to the others, which re-form without it
  // in their processes (ddp/comm/recovery.h); ddprun serves their store.
  bool recover_in_process = false;
  double monitor_interval = 0.1;
  double term_timeout = 30;
  std::string role = "default";

  std::string log_dir;  // empty: no per-rank files unless --tee/--redirects
  StdSpec redirects;
  StdSpec tee;
  std::optional<std::set<int>> local_ranks_filter;

  // One-line notes for the user (Slurm defaults taken, ignored flags).
  std::vector<std::string> notes;
};

// Parses argv. Reads PET_<FLAG> variables (torchrun's environment defaults),
// SLURM_NNODES / SLURM_NODEID / SLURM_JOB_NODELIST, DDPRUN_TERM_TIMEOUT and
// PYTHON_EXEC. Prints --help or --version to `out` and returns nullopt.
// Throws UsageError, also when srun started this ddprun more than once on
// this node (slurm_step.h); LaunchError when a .py PROGRAM has no Python
// with torch to run it (python.h).
// Does not count GPUs: resolve_nproc() does that.
std::optional<Options> parse_command_line(int argc, const char* const* argv, std::ostream& out);

// Turns --nproc-per-node auto/gpu/cpu into a number. Throws LaunchError for
// "gpu" on a machine without a visible GPU, and UsageError for a number above
// nproc_limit() (one that would fork until EAGAIN) unless the environment's
// DDPRUN_MAX_NPROC allows it.
void resolve_nproc(Options& options);

// The most workers a node starts without DDPRUN_MAX_NPROC: kNprocPerDevice
// per usable CPU or visible GPU (whichever are more), at least kNprocFloor.
constexpr int kNprocPerDevice = 4;
constexpr int kNprocFloor = 64;
int nproc_limit(int cpus, int gpus);

// What --version prints: "ddprun (libddp) X.Y.Z", the project's version,
// then "backends: gloo, mpi", the process-group backends libddp was built
// with (ddprun itself links none of them).
std::string version_line();

// Where --help sends the reader: the docs installed with the ddprun at
// `executable` (PREFIX/bin/ddprun -> PREFIX/share/doc/ddp/launcher.md, so a
// relocated installation finds its own), else the source tree's
// docs/launcher.md that this ddprun was built from.
std::string documentation_path(const std::string& executable);

// PATH, or the default search path where PATH is unset.
std::string search_path();
// `name` looked up in the ':'-separated `path` (an empty entry is "."), or
// `name` itself if it contains '/': the first executable regular file.
std::optional<std::string> find_program(const std::string& name, const std::string& path);

// "host:port", "[v6]:port" or "host" (then `default_port`). Throws UsageError.
std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port, const std::string& flag);

}  // namespace ddprun
