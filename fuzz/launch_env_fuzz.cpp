// Fuzzes the launch environment (src/runtime/launch_env.cpp): the bytes are
// environment lines NAME=VALUE (torchrun's, Slurm's, Open MPI's, PMI's
// variables), read through LaunchEnv::from_lookup as a worker reads its
// own environment. A bad value must be a ddp::LaunchEnvError; anything else
// is a finding, and so is a result outside its ranges. Run: fuzz/README.md.
#include <map>
#include <string>

#include "ddp/runtime/launch_env.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> vars;
  for (const auto& line : ddp::fuzz::lines(data, size)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  const ddp::LaunchEnv::Lookup lookup = [&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  try {
    (void)ddp::slurm_tasks_on_node(lookup);
  } catch (const ddp::LaunchEnvError&) {
  }
  (void)ddp::default_port_for_job(ddp::slurm_job_id(lookup));
  try {
    const ddp::LaunchEnv env = ddp::LaunchEnv::from_lookup(lookup);
    // What the readers promise: ranks inside the world, a world of at least one.
    if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size || env.local_world_size < 1 ||
        env.local_rank < 0 || env.local_rank >= env.local_world_size)
      __builtin_trap();
    (void)env.source_name();
  } catch (const ddp::LaunchEnvError&) {
  }
  return 0;
}
