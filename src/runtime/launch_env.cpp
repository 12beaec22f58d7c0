#include "ddp/runtime/launch_env.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "ddp/runtime/hostlist.h"
#include "runtime/parse_number.h"

namespace ddp {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw LaunchEnvError("launch environment: " + message);
}

long parse_int(const std::string& name, const std::string& value, long lo, long hi) {
  const auto v = parse_integer(value);
  if (!v) fail(name + "='" + value + "' is not an integer; set it to a whole number or unset it");
  if (*v < lo || *v > hi)
    fail(name + "=" + value + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<long>(*v);
}

class Reader {
 public:
  explicit Reader(const LaunchEnv::Lookup& lookup) : lookup_(lookup) {}
  bool has(const std::string& name) const { return lookup_(name).has_value(); }
  std::optional<std::string> str(const std::string& name) const { return lookup_(name); }
  std::optional<int> integer(const std::string& name, long lo = 0,
                             long hi = std::numeric_limits<int>::max()) const {
    auto v = lookup_(name);
    if (!v) return std::nullopt;
    return static_cast<int>(parse_int(name, *v, lo, hi));
  }
  int required(const std::string& name, const std::string& because, long lo = 0) const {
    auto v = integer(name, lo);
    if (!v) fail(name + " is not set but " + because + "; set it (ddprun and torchrun do)");
    return *v;
  }

 private:
  const LaunchEnv::Lookup& lookup_;
};

// Slurm's compressed task counts, "4(x2),3": nodes 0 and 1 run 4 tasks,
// node 2 runs 3. The count of node `node`, or nullopt past the list.
std::optional<int> tasks_on_node(const std::string& name, const std::string& value, int node) {
  const auto bad = [&] { fail(name + "='" + value + "' is not a Slurm task count list such as 4(x2),3"); };
  if (value.empty() || value.back() == ',') bad();
  std::optional<int> found;
  long first_node = 0;  // of the current item
  for (size_t at = 0; at < value.size();) {
    size_t end = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, end - at);
    const size_t paren = item.find('(');
    const auto count = parse_integer(item.substr(0, paren));
    if (!count || *count < 1 || *count > std::numeric_limits<int>::max()) bad();
    long long repeat = 1;
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') bad();
      const auto r = parse_integer(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1) bad();
      repeat = *r;
    }
    if (!found && node >= first_node && node - first_node < repeat) found = static_cast<int>(*count);
    first_node += static_cast<long>(std::min<long long>(repeat, std::numeric_limits<int>::max()));
    at = end + 1;
  }
  return found;
}

void check(const LaunchEnv& env, const char* rank_var, const char* size_var, const char* local_var,
           const char* local_size_var) {
  auto n = [](const char* s) { return std::string(s); };
  if (env.world_size < 1) fail(n(size_var) + "=" + std::to_string(env.world_size) + " must be at least 1");
  if (env.rank >= env.world_size)
    fail(n(rank_var) + "=" + std::to_string(env.rank) + " is not below " + size_var + "=" +
         std::to_string(env.world_size) + "; every rank must be in [0, world size)");
  if (env.local_world_size < 1 || env.local_world_size > env.world_size)
    fail(n(local_size_var) + "=" + std::to_string(env.local_world_size) + " must be in [1, " + size_var + "=" +
         std::to_string(env.world_size) + "]");
  if (env.local_rank >= env.local_world_size)
    fail(n(local_var) + "=" + std::to_string(env.local_rank) + " is not below " + local_size_var + "=" +
         std::to_string(env.local_world_size));
}

void read_master(const Reader& r, LaunchEnv& env, std::optional<std::string> fallback_addr,
                 const std::string& how_to_pass = "") {
  if (auto addr = r.str("MASTER_ADDR")) {
    if (addr->empty()) fail("MASTER_ADDR is set but empty; set it to the host name or address of rank 0");
    env.master_addr = *addr;
  } else if (fallback_addr) {
    env.master_addr = *fallback_addr;
  } else if (env.world_size > 1) {
    fail("MASTER_ADDR is not set and world size is " + std::to_string(env.world_size) +
         " across more than one host; set MASTER_ADDR to the host of rank 0 on every rank" +
         (how_to_pass.empty() ? std::string(" (ddprun and torchrun do)") : ": " + how_to_pass));
  }
  if (auto port = r.str("MASTER_PORT"))
    env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535));
  else if (!env.job_id.empty())
    env.master_port = default_port_for_job(env.job_id);
  else if (env.world_size > 1 && env.source == LaunchEnv::Source::Torchrun)
    fail("MASTER_PORT is not set and world size is " + std::to_string(env.world_size) +
         "; set MASTER_PORT to a free port on the master (ddprun and torchrun do)");
}

// A Slurm task (srun): its rank, its node's share of the job's tasks, and
// rank 0's host, the first of the step's (or the job's) node list.
void read_slurm(const Reader& r, const LaunchEnv::Lookup& lookup, LaunchEnv& env) {
  env.source = LaunchEnv::Source::Slurm;
  env.rank = r.required("SLURM_PROCID", "this is a Slurm task");
  env.world_size = r.required("SLURM_NTASKS", "SLURM_PROCID is set", 1);
  if (env.world_size > 1 && !r.has("SLURM_STEP_ID") && !r.has("SLURM_STEPID"))
    fail("Slurm's variables say " + std::to_string(env.world_size) +
         " tasks (SLURM_NTASKS) but this process is not one of them: there is no job step (SLURM_STEP_ID is "
         "unset), as in a batch script that runs the program itself. Launch it with srun (srun ./train ...), "
         "or one ddprun per node (srun --ntasks-per-node 1 ddprun ...)");
  env.local_rank = r.required("SLURM_LOCALID", "SLURM_PROCID is set");
  const auto here = slurm_tasks_on_node(lookup);
  env.local_world_size = here ? here->count : env.world_size;
  check(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", here ? here->from.c_str() : "SLURM_NTASKS");
  env.job_id = slurm_job_id(lookup);
  std::optional<std::string> master;
  for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
    auto nodes = r.str(list);
    if (!nodes) continue;
    try {
      master = first_host(*nodes);
    } catch (const LaunchEnvError& e) {
      fail(std::string(list) + ": " + e.what());
    }
    break;
  }
  read_master(r, env, master);
}

// A process of Open MPI's mpirun.
void read_open_mpi(const Reader& r, LaunchEnv& env) {
  env.source = LaunchEnv::Source::OpenMPI;
  env.rank = r.required("OMPI_COMM_WORLD_RANK", "this is an Open MPI process");
  env.world_size = r.required("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set", 1);
  env.local_rank = r.integer("OMPI_COMM_WORLD_LOCAL_RANK").value_or(env.rank);
  env.local_world_size = r.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(env.world_size);
  check(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (auto ns = r.str("PMIX_NAMESPACE"); ns && !ns->empty()) env.job_id = "mpi:" + *ns;
  // Single-node mpirun needs no MASTER_ADDR: loopback is the only sane default.
  std::optional<std::string> master;
  if (env.local_world_size == env.world_size) master = "127.0.0.1";
#ifdef DDP_WITH_MPI
  // Across hosts, a build with MPI learns rank 0's address over MPI
  // itself (init_process_group); this Torch- and MPI-free reader only
  // says so.
  if (!master && !r.has("MASTER_ADDR")) {
    master = "";
    env.master_over_mpi = true;
  }
#endif
  read_master(r, env, master, "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port> ...");
}

void read_pmi(const Reader& r, LaunchEnv& env) {
  // MPICH's and Intel MPI's Hydra; MPI_LOCALRANKID/MPI_LOCALNRANKS are theirs too.
  env.source = LaunchEnv::Source::PMI;
  env.rank = r.required("PMI_RANK", "this is an MPICH or Intel MPI process");
  env.world_size = r.required("PMI_SIZE", "PMI_RANK is set", 1);
  const auto local_rank = r.integer("MPI_LOCALRANKID");
  const auto local_size = r.integer("MPI_LOCALNRANKS", 1);
  env.local_rank = local_rank.value_or(env.rank);
  env.local_world_size = local_size.value_or(env.world_size);
  check(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
  std::optional<std::string> master;
  if (local_size && *local_size == env.world_size) master = "127.0.0.1";
  read_master(r, env, master, "mpiexec -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT <free port> ...");
}

}  // namespace

LaunchEnv LaunchEnv::from_lookup(const Lookup& lookup) {
  Reader r(lookup);
  LaunchEnv env;
  if (r.has("RANK") || r.has("WORLD_SIZE")) {
    env.source = Source::Torchrun;
    env.world_size = r.required("WORLD_SIZE", "RANK is set", 1);
    env.rank = r.required("RANK", "WORLD_SIZE is set");
    env.local_rank = r.integer("LOCAL_RANK").value_or(env.rank);
    env.local_world_size = r.integer("LOCAL_WORLD_SIZE", 1).value_or(env.world_size);
    check(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    read_master(r, env, std::nullopt);
  } else if (r.has("SLURM_PROCID")) {
    read_slurm(r, lookup, env);
  } else if (r.has("OMPI_COMM_WORLD_RANK")) {
    read_open_mpi(r, env);
  } else if (r.has("PMI_RANK")) {
    read_pmi(r, env);
  } else {
    read_master(r, env, std::string("127.0.0.1"));
  }
  return env;
}

std::optional<std::string> LaunchEnv::process_environment(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

LaunchEnv LaunchEnv::from_environment() { return from_lookup(process_environment); }

std::optional<SlurmTaskCount> slurm_tasks_on_node(const LaunchEnv::Lookup& lookup) {
  const Reader r(lookup);
  const int node = r.integer("SLURM_NODEID").value_or(0);
  if (auto step = r.str("SLURM_STEP_TASKS_PER_NODE"))
    if (auto here = tasks_on_node("SLURM_STEP_TASKS_PER_NODE", *step, node))
      return SlurmTaskCount{*here, "SLURM_STEP_TASKS_PER_NODE"};
  if (auto here = r.integer("SLURM_NTASKS_PER_NODE", 1)) return SlurmTaskCount{*here, "SLURM_NTASKS_PER_NODE"};
  if (auto tasks = r.str("SLURM_TASKS_PER_NODE"))
    if (auto here = tasks_on_node("SLURM_TASKS_PER_NODE", *tasks, node))
      return SlurmTaskCount{*here, "SLURM_TASKS_PER_NODE"};
  return std::nullopt;
}

std::string slurm_job_id(const LaunchEnv::Lookup& lookup) {
  const auto job = lookup("SLURM_JOB_ID");
  if (!job) return "";
  return "slurm:" + *job + "." + lookup("SLURM_STEP_ID").value_or(lookup("SLURM_STEPID").value_or("batch"));
}

uint16_t default_port_for_job(const std::string& job_id) {
  if (job_id.empty()) return 29500;
  uint64_t h = 1469598103934665603ull;  // FNV-1a: the same on every host and build
  for (unsigned char c : job_id) h = (h ^ c) * 1099511628211ull;
  return static_cast<uint16_t>(15000 + h % 15000);
}

std::string rank_from_environment() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name); v && *v) return v;
  return "0";
}

std::string LaunchEnv::source_name() const {
  switch (source) {
    case Source::Torchrun: return "torchrun";
    case Source::Slurm: return "slurm";
    case Source::OpenMPI: return "openmpi";
    case Source::PMI: return "pmi";
    case Source::Single: return "single";
  }
  return "single";
}

}  // namespace ddp
