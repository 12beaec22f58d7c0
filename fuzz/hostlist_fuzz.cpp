// Fuzzes the Slurm host list expansion (src/runtime/hostlist.cpp): the bytes are a
// SLURM_JOB_NODELIST value. A malformed one must be a ddp::LaunchEnvError;
// anything else (a crash, another exception, gigabytes of host names) is a
// finding. Run: fuzz/README.md.
#include <string>

#include "ddp/errors.h"
#include "ddp/runtime/hostlist.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto hosts = ddp::expand_hostlist(text);
    if (hosts.empty() || ddp::first_host(text) != hosts.front()) __builtin_trap();
  } catch (const ddp::LaunchEnvError&) {
  }
  return 0;
}
