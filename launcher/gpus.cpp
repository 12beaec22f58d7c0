#include "gpus.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "runtime/parse_number.h"

namespace ddprun {
namespace {

// dlopen handle that is closed again; GPU discovery runs once.
struct Library {
  void* handle = nullptr;
  explicit Library(const char* name) : handle(::dlopen(name, RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle) ::dlclose(handle);
  }
  template <class F>
  F symbol(const char* name) const {
    return handle ? reinterpret_cast<F>(::dlsym(handle, name)) : nullptr;
  }
};

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  size_t b = s.find_last_not_of(" \t");
  return s.substr(a, b - a + 1);
}

std::optional<GpuCount> from_libcuda() {
  Library cuda("libcuda.so.1");
  if (!cuda.handle) return std::nullopt;
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  auto init = cuda.symbol<Init>("cuInit");
  auto count = cuda.symbol<Count>("cuDeviceGetCount");
  if (!init || !count) return std::nullopt;
  // cuInit fails with "no device" on driver-only machines: that is 0 GPUs.
  if (init(0) != 0) return GpuCount{0, "libcuda.so.1 (cuInit failed: no usable GPU)"};
  int n = 0;
  if (count(&n) != 0) return GpuCount{0, "libcuda.so.1 (cuDeviceGetCount failed)"};
  return GpuCount{n, "libcuda.so.1"};
}

std::optional<GpuCount> from_nvml() {
  Library nvml("libnvidia-ml.so.1");
  if (!nvml.handle) return std::nullopt;
  using Init = int (*)();
  using Count = int (*)(unsigned*);
  using Shutdown = int (*)();
  auto init = nvml.symbol<Init>("nvmlInit_v2");
  auto count = nvml.symbol<Count>("nvmlDeviceGetCount_v2");
  auto shutdown = nvml.symbol<Shutdown>("nvmlShutdown");
  if (!init || !count) return std::nullopt;
  if (init() != 0) return GpuCount{0, "libnvidia-ml.so.1 (nvmlInit failed)"};
  unsigned n = 0;
  int rc = count(&n);
  if (shutdown) shutdown();
  if (rc != 0) return GpuCount{0, "libnvidia-ml.so.1 (nvmlDeviceGetCount failed)"};
  // NVML ignores CUDA_VISIBLE_DEVICES; apply CUDA's rule ourselves.
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  int visible = cvd ? count_visible(cvd, static_cast<int>(n)) : static_cast<int>(n);
  return GpuCount{visible, "libnvidia-ml.so.1"};
}

}  // namespace

int count_visible(const std::string& cvd, int physical) {
  std::set<std::string> seen;
  int visible = 0;
  size_t start = 0;
  while (start <= cvd.size()) {
    size_t comma = cvd.find(',', start);
    if (comma == std::string::npos) comma = cvd.size();
    std::string item = trim(cvd.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) break;
    bool numeric = std::all_of(item.begin(), item.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    std::string key;
    if (numeric) {
      auto index = ddp::parse_integer(item, 0, physical - 1);
      if (!index) break;
      key = std::to_string(*index);
    } else if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      key = item;  // UUIDs cannot be checked without a driver query; trust them
    } else {
      break;
    }
    if (!seen.insert(key).second) break;
    ++visible;
  }
  return std::min(visible, physical);
}

GpuCount count_visible_gpus() {
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    if (count_visible(cvd, 1 << 20) == 0)
      return GpuCount{0, std::string("CUDA_VISIBLE_DEVICES='") + cvd + "' hides every GPU"};
  }
  if (auto c = from_libcuda()) return *c;
  if (auto c = from_nvml()) return *c;
  return GpuCount{0, "no NVIDIA driver library (libcuda.so.1, libnvidia-ml.so.1) could be loaded"};
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace ddprun
