// The store module's entry point (store_module.h), with C linkage so that
// ddprun finds it by name.
#include <cstring>

#include "store_module.h"

// Null when the ddprun loading the module comes from another build, whose
// StoreConfig may not be this one.
extern "C" __attribute__((visibility("default"))) ddprun::Rendezvous* ddprun_store_rendezvous(
    const char* abi, ddprun::StoreConfig* config, const ddprun::Tick* tick) {
  if (std::strcmp(abi, DDPRUN_STORE_ABI) != 0) return nullptr;
  return ddprun::make_store_rendezvous(std::move(*config), *tick).release();
}
