#include "ddp/launch_env.h"

#include <cstdlib>
#include <limits>

#include "ddp/hostlist.h"
#include "parse_number.h"

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

// "4(x2),3" -> 4: the tasks on the first node, the count for local_world_size
// when SLURM_NTASKS_PER_NODE is not set.
int first_task_count(const std::string& value) {
  size_t end = value.find_first_not_of("0123456789");
  std::string head = value.substr(0, end);
  return static_cast<int>(parse_int("SLURM_TASKS_PER_NODE", head, 1, std::numeric_limits<int>::max()));
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

void read_master(const Reader& r, LaunchEnv& env, std::optional<std::string> fallback_addr) {
  if (auto addr = r.str("MASTER_ADDR")) {
    if (addr->empty()) fail("MASTER_ADDR is set but empty; set it to the host name or address of rank 0");
    env.master_addr = *addr;
  } else if (fallback_addr) {
    env.master_addr = *fallback_addr;
  } else if (env.world_size > 1) {
    fail("MASTER_ADDR is not set and world size is " + std::to_string(env.world_size) +
         "; set MASTER_ADDR to the host of rank 0 (ddprun and torchrun do)");
  }
  if (auto port = r.str("MASTER_PORT"))
    env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535));
  else if (env.world_size > 1 && env.source == LaunchEnv::Source::Torchrun)
    fail("MASTER_PORT is not set and world size is " + std::to_string(env.world_size) +
         "; set MASTER_PORT to a free port on the master (ddprun and torchrun do)");
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
    env.source = Source::Slurm;
    env.rank = r.required("SLURM_PROCID", "this is a Slurm task");
    env.world_size = r.required("SLURM_NTASKS", "SLURM_PROCID is set", 1);
    env.local_rank = r.required("SLURM_LOCALID", "SLURM_PROCID is set");
    if (auto per_node = r.integer("SLURM_NTASKS_PER_NODE", 1))
      env.local_world_size = *per_node;
    else if (auto tasks = r.str("SLURM_TASKS_PER_NODE"))
      env.local_world_size = first_task_count(*tasks);
    else
      env.local_world_size = env.world_size;
    check(env, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    std::optional<std::string> master;
    if (auto nodes = r.str("SLURM_JOB_NODELIST")) {
      try {
        master = first_host(*nodes);
      } catch (const LaunchEnvError& e) {
        fail(std::string("SLURM_JOB_NODELIST: ") + e.what());
      }
    }
    read_master(r, env, master);
  } else if (r.has("OMPI_COMM_WORLD_RANK")) {
    env.source = Source::OpenMPI;
    env.rank = r.required("OMPI_COMM_WORLD_RANK", "this is an Open MPI process");
    env.world_size = r.required("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set", 1);
    env.local_rank = r.integer("OMPI_COMM_WORLD_LOCAL_RANK").value_or(env.rank);
    env.local_world_size = r.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(env.world_size);
    check(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE");
    // Single-node mpirun needs no MASTER_ADDR: loopback is the only sane default.
    std::optional<std::string> master;
    if (env.local_world_size == env.world_size) master = "127.0.0.1";
    read_master(r, env, master);
  } else {
    read_master(r, env, std::string("127.0.0.1"));
  }
  return env;
}

LaunchEnv LaunchEnv::from_environment() {
  return from_lookup([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

std::string LaunchEnv::source_name() const {
  switch (source) {
    case Source::Torchrun: return "torchrun";
    case Source::Slurm: return "slurm";
    case Source::OpenMPI: return "openmpi";
    case Source::Single: return "single";
  }
  return "single";
}

}  // namespace ddp
