#include "cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <random>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "ddp/runtime/hostlist.h"
#include "cli_flags.h"
#include "ddp/runtime/launch_env.h"
#include "errors.h"
#include "gpus.h"
#include "runtime/parse_number.h"
#include "python.h"
#include "slurm_step.h"

// Set by launcher/CMakeLists.txt.
#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "unknown"
#endif
#ifndef DDPRUN_SOURCE_DOCS
#define DDPRUN_SOURCE_DOCS ""
#endif

namespace po = boost::program_options;

namespace ddprun {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

[[noreturn]] void usage(const std::string& what) { throw UsageError(what + " (see ddprun --help)"); }

// The numbers themselves are read by ddp::parse_integer/parse_seconds, as
// the library reads its own; only the way a bad one is reported is ours.
int to_int(const std::string& text, const std::string& flag) {
  auto v = ddp::parse_integer(text, INT32_MIN, INT32_MAX);
  if (!v) usage(flag + " expects a whole number, got '" + text + "'");
  return static_cast<int>(*v);
}

double to_seconds(const std::string& text, const std::string& flag) {
  auto v = ddp::parse_seconds(text);
  if (!v) usage(flag + " expects seconds >= 0, got '" + text + "'");
  return *v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

// "--nproc_per_node=4" -> "--nproc-per-node=4": one spelling for Boost.
std::string normalize_flag(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  size_t eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  for (size_t i = 2; i < name.size(); ++i)
    if (name[i] == '_') name[i] = '-';
  return eq == std::string::npos ? name : name + arg.substr(eq);
}

struct SplitArgs {
  std::vector<std::string> flags;
  std::vector<std::string> command;
};

// Options end at the first non-option word (PROGRAM) or at "--": everything
// after belongs to the program, even words that look like our flags.
SplitArgs split_args(int argc, const char* const* argv, const po::options_description& d) {
  SplitArgs out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (int j = i + 1; j < argc; ++j) out.command.push_back(argv[j]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      for (int j = i; j < argc; ++j) out.command.push_back(argv[j]);
      break;
    }
    a = normalize_flag(a);
    out.flags.push_back(a);
    const po::option_description* od = nullptr;
    bool attached = false;
    if (a.rfind("--", 0) == 0) {
      size_t eq = a.find('=');
      attached = eq != std::string::npos;
      const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      // An empty name ("--=x") is a prefix of every option: Boost would throw
      // ambiguous_option past our usage message (found by fuzz/ddprun_cli_fuzz).
      if (!name.empty()) od = d.find_nothrow(name, false);
      if (!od) usage("unknown option '" + a.substr(0, a.find('=')) + "'");
    } else {
      od = d.find_nothrow(a.substr(0, 2), false, false, false);  // Boost stores short names as "-r"
      if (!od) usage("unknown option '" + a.substr(0, 2) + "'");
      attached = a.size() > 2;
    }
    if (!attached && od->semantic()->max_tokens() > 0) {
      if (i + 1 >= argc) usage("option '" + a + "' needs a value");
      out.flags.push_back(argv[++i]);
    }
  }
  return out;
}

bool executable_file(const std::string& path, std::string& why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    why = std::strerror(errno);
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    why = "it is a directory";
    return false;
  }
  if (::access(path.c_str(), X_OK) != 0) {
    why = "it is not executable (chmod +x it, or name its interpreter first: ddprun ... python3 " + path + ")";
    return false;
  }
  return true;
}

// PATH search done here, before any fork: the child then only calls execve,
// and a missing program is a clear usage error instead of N worker failures.
std::string resolve_program(const std::string& name) {
  std::string why;
  if (name.find('/') != std::string::npos) {
    if (executable_file(name, why)) return name;
    usage("cannot run PROGRAM '" + name + "': " + why);
  }
  if (auto found = find_program(name, search_path())) return *found;
  usage("PROGRAM '" + name + "' not found in PATH; give its path (./" + name + ") or install it");
}

std::string random_run_id() {
  std::random_device rd;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%08x", rd(), rd() & 0xffff, rd() & 0xffff, rd());
  return buf;
}

RdzvConf parse_rdzv_conf(const std::string& text, std::vector<std::string>& notes) {
  RdzvConf c;
  if (text.empty()) return c;
  for (const auto& item : split(text, ',')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) usage("--rdzv-conf expects KEY=VALUE pairs, got '" + item + "'");
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    std::string flag = "--rdzv-conf " + k;
    if (k == "join_timeout" || k == "timeout") c.join_timeout = to_seconds(v, flag);
    else if (k == "last_call_timeout") c.last_call_timeout = to_seconds(v, flag);
    else if (k == "close_timeout") c.close_timeout = to_seconds(v, flag);
    else if (k == "keep_alive_interval") c.keep_alive_interval = std::max(0.1, to_seconds(v, flag));
    else if (k == "keep_alive_max_attempt") c.keep_alive_max_attempt = std::max(1, to_int(v, flag));
    else if (k == "is_host") {
      std::string l = lower(v);
      if (l == "1" || l == "true" || l == "yes") c.is_host = true;
      else if (l == "0" || l == "false" || l == "no") c.is_host = false;
      else usage(flag + " expects true or false, got '" + v + "'");
    } else {
      notes.push_back("ignoring --rdzv-conf key '" + k + "' (ddprun understands join_timeout, last_call_timeout, "
                      "close_timeout, keep_alive_interval, keep_alive_max_attempt, is_host)");
    }
  }
  return c;
}

}  // namespace

std::string search_path() {
  const char* path = std::getenv("PATH");
  return path ? path : "/usr/local/bin:/usr/bin:/bin";
}

std::optional<std::string> find_program(const std::string& name, const std::string& path) {
  std::string ignored;
  if (name.find('/') != std::string::npos)
    return executable_file(name, ignored) ? std::optional<std::string>(name) : std::nullopt;
  for (auto dir : split(path + ":", ':')) {
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (executable_file(candidate, ignored)) return candidate;
  }
  return std::nullopt;
}

std::string version_line() { return "ddprun (libddp) " DDPRUN_VERSION "\nbackends: " DDPRUN_BACKENDS; }

std::string documentation_path(const std::string& executable) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!executable.empty()) {
    fs::path installed = fs::path(executable).parent_path().parent_path() / "share" / "doc" / "ddp" / "launcher.md";
    if (fs::is_regular_file(installed, ec)) return installed.string();
  }
  // In a build tree: DDPRUN_SOURCE_DOCS, relative to ddprun's folder (no checkout's path: ccache hits in any clone).
  const fs::path in_source = (fs::path(executable).parent_path() / DDPRUN_SOURCE_DOCS).lexically_normal();
  if (*DDPRUN_SOURCE_DOCS && !executable.empty() && fs::is_regular_file(in_source, ec)) return in_source.string();
  return "docs/launcher.md in libddp's source (not installed beside this ddprun)";
}

int StdSpec::of(int local_rank) const {
  if (!mapped) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? 0 : it->second;
}

StdSpec StdSpec::parse(const std::string& text, const std::string& flag) {
  auto value = [&](const std::string& v) {
    if (v.size() != 1 || v[0] < '0' || v[0] > '3')
      usage(flag + " expects 0 (none), 1 (stdout), 2 (stderr) or 3 (both), optionally per local rank as "
                   "0:1,1:2; got '" + text + "'");
    return v[0] - '0';
  };
  StdSpec s;
  if (text.find(':') == std::string::npos) {
    s.all = value(text);
    return s;
  }
  s.mapped = true;
  for (const auto& item : split(text, ',')) {
    size_t colon = item.find(':');
    if (colon == std::string::npos) value("?");
    int rank = to_int(item.substr(0, colon), flag + " local rank");
    if (rank < 0) usage(flag + ": local rank must be >= 0 in '" + text + "'");
    s.per_rank[rank] = value(item.substr(colon + 1));
  }
  return s;
}

std::pair<std::string, int> parse_endpoint(const std::string& text, int default_port, const std::string& flag) {
  std::string host = text, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) usage(flag + ": unbalanced '[' in '" + text + "'");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') usage(flag + ": expected [HOST]:PORT, got '" + text + "'");
      port = text.substr(close + 2);
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    size_t colon = text.find(':');
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) usage(flag + ": no host in '" + text + "'");
  int p = port.empty() ? default_port : to_int(port, flag + " port");
  if (p < 1 || p > 65535) usage(flag + ": port " + std::to_string(p) + " is not in [1, 65535]");
  return {host, p};
}

namespace {

// The flags on the command line, then PET_<FLAG> from the environment for
// the flags not on it (as torchrun reads them).
po::variables_map read_flags(const std::vector<std::string>& flags, const po::options_description& desc) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(flags).options(desc).run(), vm);
    // store() keeps values already given, so the command line wins.
    po::store(po::parse_environment(desc,
                                    [&](const std::string& var) -> std::string {
                                      std::string name;
                                      if (var == "DDPRUN_TERM_TIMEOUT") return "term-timeout";
                                      if (var.rfind("PET_", 0) != 0) return "";
                                      name = lower(var.substr(4));
                                      for (char& c : name)
                                        if (c == '_') c = '-';
                                      // Not flags torchrun reads from the environment.
                                      if (name == "help" || name == "version") return "";
                                      return desc.find_nothrow(name, false) ? name : "";
                                    }),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    usage(e.what());
  }
  return vm;
}

// Prints --help or --version if asked; returns whether it did.
bool printed_help_or_version(const po::variables_map& vm, const po::options_description& desc, std::ostream& out) {
  if (vm.count("help")) {
    std::error_code ec;
    out << kUsage << "\n" << desc << "\nDocumentation: "
        << documentation_path(std::filesystem::read_symlink("/proc/self/exe", ec).string()) << "\n";
    return true;
  }
  if (vm.count("version")) {
    out << version_line() << "\n";
    return true;
  }
  return false;
}

// The parsed flags, read by name.
class Flags {
 public:
  explicit Flags(const po::variables_map& vm) : vm_(vm) {}
  std::string str(const char* name) const { return vm_[name].as<std::string>(); }
  bool on(const char* name) const { return vm_[name].as<bool>(); }
  // On the command line or in the environment, not the default.
  bool given(const char* name) const { return vm_.count(name) && !vm_[name].defaulted(); }

 private:
  const po::variables_map& vm_;
};

// Where the nodes are, as the flags (or Slurm, for the flags left out) say,
// before it is checked against the rendezvous backend.
struct NodeFlags {
  std::string nnodes;
  std::string master_addr;
  int node_rank = 0;
  int master_port_default = 0;  // set under Slurm when --master-port was not given
};

// Under srun each node's ddprun sees its own SLURM_NODEID; only flags the
// user left out are filled in, so explicit flags always win. The step's
// variables come first: a step may run on part of the allocation.
void take_slurm_defaults(const Flags& f, NodeFlags& n, std::vector<std::string>& notes) {
  auto first_set = [](std::initializer_list<const char*> names) -> std::pair<const char*, const char*> {
    for (const char* name : names)
      if (const char* v = std::getenv(name)) return {name, v};
    return {nullptr, nullptr};
  };
  const auto [nnodes_var, s_nnodes] = first_set({"SLURM_STEP_NUM_NODES", "SLURM_NNODES"});
  const char* s_nodeid = std::getenv("SLURM_NODEID");
  const auto [nodelist_var, s_nodelist] = first_set({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"});
  if (!s_nnodes && !s_nodeid && !s_nodelist) return;
  std::vector<std::string> taken;
  if (s_nnodes && !f.given("nnodes")) {
    n.nnodes = s_nnodes;
    taken.push_back("--nnodes " + n.nnodes + " (" + nnodes_var + ")");
  }
  if (s_nodeid && !f.given("node-rank")) {
    n.node_rank = to_int(s_nodeid, "SLURM_NODEID");
    taken.push_back("--node-rank " + std::to_string(n.node_rank) + " (SLURM_NODEID)");
  }
  if (s_nodelist && !f.given("master-addr") && !f.given("rdzv-endpoint")) {
    try {
      n.master_addr = ddp::first_host(s_nodelist);
    } catch (const std::exception& e) {
      usage(std::string(nodelist_var) + ": " + e.what() + "; pass --master-addr instead");
    }
    taken.push_back("--master-addr " + n.master_addr + " (first host of " + nodelist_var + ")");
  }
  // Jobs sharing a node must not meet on 29500: the port comes from the
  // job and step, as the library's own default does (ddp/runtime/launch_env.h).
  const std::string job_id = ddp::slurm_job_id(ddp::LaunchEnv::process_environment);
  if (!job_id.empty() && !f.given("master-port") && !f.given("rdzv-endpoint")) {
    n.master_port_default = ddp::default_port_for_job(job_id);
    taken.push_back("--master-port " + std::to_string(n.master_port_default) + " (from SLURM_JOB_ID and SLURM_STEP_ID)");
  }
  if (taken.empty()) return;
  std::string note = "under Slurm:";
  for (size_t i = 0; i < taken.size(); ++i) note += (i ? ", " : " ") + taken[i];
  notes.push_back(note);
}

// --nnodes N or MIN:MAX.
void parse_nnodes(const std::string& nnodes, Options& o) {
  auto parts = split(nnodes, ':');
  if (parts.size() == 1) {
    o.min_nodes = o.max_nodes = to_int(parts[0], "--nnodes");
  } else if (parts.size() == 2) {
    o.min_nodes = to_int(parts[0], "--nnodes MIN");
    o.max_nodes = to_int(parts[1], "--nnodes MAX");
  } else {
    usage("--nnodes expects N or MIN:MAX, got '" + nnodes + "'");
  }
  if (o.min_nodes < 1 || o.min_nodes > o.max_nodes)
    usage("--nnodes " + nnodes + ": need 1 <= MIN <= MAX");
}

// --rdzv-*, --local-addr, --master-addr and --master-port, each on its own.
void parse_rendezvous_flags(const Flags& f, const NodeFlags& n, Options& o) {
  o.rdzv_backend = lower(f.str("rdzv-backend"));
  if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d")
    usage("--rdzv-backend must be static or c10d, got '" + o.rdzv_backend + "'");
  o.run_id = f.str("rdzv-id");
  if (o.run_id.empty()) usage("--rdzv-id must not be empty");
  o.rdzv_conf = parse_rdzv_conf(f.str("rdzv-conf"), o.notes);
  o.local_addr = f.str("local-addr");
  o.master_addr = n.master_addr;
  o.master_port = n.master_port_default ? n.master_port_default : to_int(f.str("master-port"), "--master-port");
  if (o.master_port < 1 || o.master_port > 65535)
    usage("--master-port " + std::to_string(o.master_port) + " is not in [1, 65535]");
  if (o.master_addr.size() > 2 && o.master_addr.front() == '[' && o.master_addr.back() == ']')
    o.master_addr = o.master_addr.substr(1, o.master_addr.size() - 2);
  if (o.master_addr.empty()) usage("--master-addr must not be empty");
}

// What --standalone, or the rendezvous backend, makes of the node flags.
void settle_nodes(const Flags& f, const NodeFlags& n, Options& o) {
  std::string endpoint = f.str("rdzv-endpoint");
  if (o.standalone) {
    if (f.given("nnodes") && o.max_nodes > 1)
      usage("--standalone runs exactly one node; drop --nnodes " + n.nnodes + " or --standalone");
    if (f.given("rdzv-backend") || f.given("rdzv-endpoint") || f.given("rdzv-id"))
      o.notes.push_back("--standalone: ignoring --rdzv-backend/--rdzv-endpoint/--rdzv-id (as torchrun does)");
    o.min_nodes = o.max_nodes = 1;
    o.rdzv_backend = "static";
    o.master_addr = "127.0.0.1";
    o.run_id = random_run_id();  // torchrun uses a fresh uuid4 as well
  } else if (o.rdzv_backend == "c10d") {
    if (endpoint.empty()) usage("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]");
    std::tie(o.endpoint_host, o.endpoint_port) = parse_endpoint(endpoint, 29400, "--rdzv-endpoint");
  } else {
    if (o.min_nodes != o.max_nodes)
      usage("static rendezvous needs a fixed --nnodes N, not " + n.nnodes + "; use --rdzv-backend c10d for MIN:MAX");
    if (!endpoint.empty()) {
      auto ep = parse_endpoint(endpoint, o.master_port, "--rdzv-endpoint");
      o.master_addr = ep.first;
      o.master_port = ep.second;
    }
    if (n.node_rank < 0 || n.node_rank >= o.max_nodes)
      usage("--node-rank " + std::to_string(n.node_rank) + " is not in [0, " + std::to_string(o.max_nodes) +
            "); give each node a rank below --nnodes");
    o.node_rank = n.node_rank;
  }
}

// The flags for restarts, stopping, roles and the workers' output.
void parse_worker_flags(const Flags& f, Options& o) {
  o.max_restarts = to_int(f.str("max-restarts"), "--max-restarts");
  if (o.max_restarts < 0) usage("--max-restarts must be >= 0");
  o.monitor_interval = to_seconds(f.str("monitor-interval"), "--monitor-interval");
  if (o.monitor_interval <= 0) usage("--monitor-interval must be above 0 seconds");
  o.term_timeout =
      to_seconds(f.str("term-timeout"), f.given("term-timeout") ? "--term-timeout" : "DDPRUN_TERM_TIMEOUT");
  o.role = f.str("role");
  o.log_dir = f.str("log-dir");
  o.redirects = StdSpec::parse(f.str("redirects"), "--redirects");
  o.tee = StdSpec::parse(f.str("tee"), "--tee");
  std::string filter = f.str("local-ranks-filter");
  if (!filter.empty()) {
    std::set<int> ranks;
    for (const auto& r : split(filter, ',')) {
      int v = to_int(r, "--local-ranks-filter");
      if (v < 0) usage("--local-ranks-filter: local ranks are >= 0, got " + r);
      ranks.insert(v);
    }
    o.local_ranks_filter = ranks;
  }
  if (f.given("start-method") && f.str("start-method") != "spawn" && f.str("start-method") != "fork" &&
      f.str("start-method") != "forkserver")
    usage("--start-method must be spawn, fork or forkserver");
}

// torchrun runs PROGRAM with Python unless --no-python; ddprun runs it
// directly unless it is a .py script or --module is given.
void resolve_command(const Flags& f, const std::vector<std::string>& command, Options& o) {
  o.program = command[0];
  bool module = f.on("module");
  bool no_python = f.on("no-python");
  if (module && no_python) usage("--module and --no-python contradict each other");
  const bool script = o.program.size() >= 3 && o.program.compare(o.program.size() - 3, 3, ".py") == 0;
  if (!module && (no_python || !script)) {
    o.command = command;
    o.command[0] = resolve_program(o.program);
    return;
  }
  if (!module && ::access(o.program.c_str(), R_OK) != 0)
    usage("cannot read script '" + o.program + "': " + std::strerror(errno));
  const char* py = std::getenv("PYTHON_EXEC");
  std::string interpreter;
  if (py && *py) {
    interpreter = resolve_program(py);  // the user's choice, as torchrun: not second-guessed
  } else {
    PythonChoice choice = choose_python(search_path(), kPythonCheckTimeout);
    interpreter = choice.path;
    if (!choice.note.empty()) o.notes.push_back(choice.note);
  }
  o.command = {interpreter, "-u"};
  if (module) o.command.push_back("-m");
  o.command.insert(o.command.end(), command.begin(), command.end());
}

}  // namespace

std::optional<Options> parse_command_line(int argc, const char* const* argv, std::ostream& out) {
  const po::options_description desc = make_description();
  const SplitArgs args = split_args(argc, argv, desc);
  const po::variables_map vm = read_flags(args.flags, desc);
  if (printed_help_or_version(vm, desc, out)) return std::nullopt;
  // Before anything else: several ddpruns of one step on this node must all
  // stop now, not meet in rendezvous.
  check_one_ddprun_per_node(ddp::LaunchEnv::process_environment);

  const Flags f(vm);
  Options o;
  if (args.command.empty()) usage("no PROGRAM given: ddprun [options] PROGRAM [ARGS...]");
  if (f.on("run-path"))
    usage("--run-path runs a script inside torchrun's Python interpreter; ddprun cannot: use 'ddprun python3 SCRIPT'");

  o.standalone = f.on("standalone");
  o.recover_in_process = f.on("recover-in-process");
  o.nproc_spec = lower(f.str("nproc-per-node"));
  if (o.nproc_spec != "auto" && o.nproc_spec != "gpu" && o.nproc_spec != "cpu") {
    o.nproc = to_int(o.nproc_spec, "--nproc-per-node");
    if (o.nproc < 1) usage("--nproc-per-node must be at least 1, or auto, gpu or cpu; got '" + o.nproc_spec + "'");
  }
  NodeFlags n;
  n.nnodes = f.str("nnodes");
  n.master_addr = f.str("master-addr");
  n.node_rank = to_int(f.str("node-rank"), "--node-rank");
  if (!o.standalone) take_slurm_defaults(f, n, o.notes);
  parse_nnodes(n.nnodes, o);
  parse_rendezvous_flags(f, n, o);
  settle_nodes(f, n, o);
  parse_worker_flags(f, o);
  resolve_command(f, args.command, o);
  return o;
}

int nproc_limit(int cpus, int gpus) { return std::max(kNprocFloor, kNprocPerDevice * std::max(cpus, gpus)); }

namespace {

// A number of workers far beyond the machine (--nproc-per-node 10000, a
// typo or a total meant for --nnodes) would fork until EAGAIN: refuse it,
// unless DDPRUN_MAX_NPROC allows that many.
void check_nproc_limit(const Options& o) {
  const int cpus = usable_cpus();
  if (o.nproc <= nproc_limit(cpus, 0)) return;
  const std::string n = std::to_string(o.nproc);
  if (const char* given = std::getenv("DDPRUN_MAX_NPROC"); given && *given) {
    auto max = ddp::parse_integer(given, 1, INT32_MAX);
    if (!max) throw UsageError(std::string("DDPRUN_MAX_NPROC must be a whole number of at least 1; got '") + given + "'");
    if (o.nproc <= *max) return;
    throw UsageError("--nproc-per-node " + n + " is more than DDPRUN_MAX_NPROC=" + given +
                     " workers; raise DDPRUN_MAX_NPROC to start that many on this node");
  }
  const GpuCount gpus = count_visible_gpus();
  const int limit = nproc_limit(cpus, gpus.count);
  if (o.nproc <= limit) return;
  throw UsageError("--nproc-per-node " + n + " would start " + n + " workers on this node, which has " +
                   std::to_string(cpus) + " usable CPUs and " + std::to_string(gpus.count) + " visible GPUs; ddprun "
                   "refuses more than " + std::to_string(limit) + " (" + std::to_string(kNprocPerDevice) +
                   " per CPU or GPU, at least " + std::to_string(kNprocFloor) + "); set DDPRUN_MAX_NPROC=" + n +
                   " to start them anyway");
}

}  // namespace

void resolve_nproc(Options& o) {
  if (o.nproc_spec != "auto" && o.nproc_spec != "gpu" && o.nproc_spec != "cpu") {
    check_nproc_limit(o);
    return;
  }
  int cpus = usable_cpus();
  if (o.nproc_spec == "cpu") {
    o.nproc = cpus;
    o.nproc_how = "--nproc-per-node cpu: " + std::to_string(cpus) + " workers (usable CPUs)";
    return;
  }
  GpuCount gpus = count_visible_gpus();
  if (gpus.count > 0) {
    o.nproc = gpus.count;
    o.nproc_how = "--nproc-per-node " + o.nproc_spec + ": " + std::to_string(gpus.count) + " workers (visible GPUs, via " +
                  gpus.how + ")";
  } else if (o.nproc_spec == "gpu") {
    throw LaunchError("--nproc-per-node gpu: no visible GPU (" + gpus.how +
                      "); use --nproc-per-node cpu or a number, or check the driver and CUDA_VISIBLE_DEVICES");
  } else {
    // torchrun's rule: auto without CUDA means one worker per CPU.
    o.nproc = cpus;
    o.nproc_how = "--nproc-per-node auto: no visible GPU (" + gpus.how + "), " + std::to_string(cpus) +
                  " workers (usable CPUs)";
  }
}

}  // namespace ddprun
