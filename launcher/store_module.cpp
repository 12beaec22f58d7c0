// Loading ddprun-store.so, the store rendezvous, on the first multi-node
// round (store_module.h).
#include "store_module.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <vector>

#include "errors.h"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "unknown"
#endif
// The module's path relative to ddprun's folder once installed
// (lib/ddprun/ddprun-store.so from bin/); in a build tree it sits beside ddprun.
#ifndef DDPRUN_STORE_MODULE_INSTALLED
#define DDPRUN_STORE_MODULE_INSTALLED ""
#endif
// What a module and the ddprun loading it must share: the version and the
// LibTorch ddprun was configured with (the module is built from the same tree).
#ifndef DDPRUN_STORE_ABI
#define DDPRUN_STORE_ABI DDPRUN_VERSION
#endif

// Defined only where the module's code is linked in (the unit tests); a weak
// reference stays null in ddprun, which loads the module instead.
extern "C" __attribute__((weak)) ddprun::Rendezvous* ddprun_store_rendezvous(const char* abi,
                                                                             ddprun::StoreConfig* config,
                                                                             const ddprun::Tick* tick);

namespace ddprun {
namespace {

constexpr const char* kModuleName = "ddprun-store.so";

std::vector<std::filesystem::path> candidates() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return {};
  const fs::path dir = exe.parent_path();
  std::vector<fs::path> places{dir / kModuleName};
  if (*DDPRUN_STORE_MODULE_INSTALLED) places.push_back((dir / DDPRUN_STORE_MODULE_INSTALLED).lexically_normal());
  return places;
}

StoreRendezvousEntry load_entry() {
  std::string tried;
  for (const auto& place : candidates()) {
    tried += (tried.empty() ? "" : ", ") + place.string();
    std::error_code ec;
    if (!std::filesystem::exists(place, ec)) continue;
    // Never closed: the rendezvous and the threads of its store live until exit.
    void* handle = ::dlopen(place.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* why = ::dlerror();
      throw LaunchError("cannot load ddprun's store module " + place.string() + " (" + (why ? why : "unknown") +
                        "), which a rendezvous on a store needs (several nodes, or --rdzv-backend c10d); "
                        "reinstall libddp, or run one node with --standalone");
    }
    auto entry = reinterpret_cast<StoreRendezvousEntry>(::dlsym(handle, kStoreModuleEntry));
    if (!entry)
      throw LaunchError(place.string() + " is not ddprun's store module (no " + kStoreModuleEntry +
                        "); reinstall libddp");
    return entry;
  }
  if (tried.empty()) tried = "beside ddprun";
  throw LaunchError("ddprun's store module " + std::string(kModuleName) + ", which a rendezvous on a store needs "
                    "(several nodes, or --rdzv-backend c10d), is not installed (looked for " + tried +
                    "); reinstall libddp with its launcher, or run one node with --standalone");
}

}  // namespace

std::unique_ptr<Rendezvous> load_store_rendezvous(StoreConfig config, const Tick& tick) {
  StoreRendezvousEntry entry = ddprun_store_rendezvous ? &ddprun_store_rendezvous : load_entry();
  std::unique_ptr<Rendezvous> made(entry(DDPRUN_STORE_ABI, &config, &tick));
  if (!made)
    throw LaunchError("ddprun's store module comes from another build of libddp than this ddprun (" +
                      std::string(DDPRUN_STORE_ABI) + "); reinstall libddp, so that both come from one build");
  return made;
}

}  // namespace ddprun
