#include "ddp/train/env_summary.h"

#include <unistd.h>

#include <torch/version.h>

#include <iomanip>
#include <sstream>
#include <vector>

#include "ddp/comm/recovery.h"
#include "ddp/runtime/launch_env.h"
#include "comm/objects/object_exchange.h"

#ifdef DDP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ddp {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string clean(std::string s) {
  for (auto& c : s)
    if (c == '|' || c == '\n') c = ' ';
  return s;
}

}  // namespace

std::string environment_summary(ProcessGroup& pg) {
  // A rank joining a running recoverable group: the others gathered theirs long ago.
  if (const auto* recoverable = dynamic_cast<const RecoverableGroup*>(&pg); recoverable && recoverable->joining())
    return "";
  const LaunchEnv env = LaunchEnv::from_environment();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const torch::Device device = pg.device();
  std::string gpu = "-", memory = "-";
#ifdef DDP_WITH_CUDA
  if (device.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device.index());
    gpu = props->name;
    std::ostringstream m;
    m << std::fixed << std::setprecision(1) << static_cast<double>(props->totalGlobalMem) / (1024.0 * 1024 * 1024)
      << " GiB";
    memory = m.str();
  }
#endif
  const std::string row = std::to_string(pg.rank()) + "|" + std::to_string(env.local_rank) + "|" + clean(host) + "|" +
                          std::to_string(::getpid()) + "|" + clean(pg.backend_name()) + "|" + device.str() + "|" +
                          clean(gpu) + "|" + memory;
  const auto rows = detail::all_gather_bytes(pg, row);
  if (pg.rank() != 0) return "";

  std::vector<std::vector<std::string>> table{{"rank", "local", "host", "pid", "backend", "device", "gpu", "memory"}};
  for (const auto& r : rows) table.push_back(split(r, '|'));
  std::vector<size_t> width(table[0].size(), 0);
  for (auto& r : table)
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::ostringstream out;
  out << "libddp: LibTorch " << TORCH_VERSION << ", " << pg.size() << " process" << (pg.size() == 1 ? "" : "es")
      << " (" << env.source_name() << "), backend " << pg.backend_name() << ", master "
      << (env.master_over_mpi ? std::string("learned over MPI") : env.master_addr) << ":" << env.master_port << "\n";
  // The library under the mpi backend (and under a master learned over MPI).
  if (const std::string mpi = mpi_library_version(); !mpi.empty()) out << "  MPI: " << mpi << "\n";
  for (auto& r : table) {
    out << "  ";
    for (size_t i = 0; i < r.size() && i < width.size(); ++i)
      out << std::left << std::setw(static_cast<int>(width[i] + 2)) << r[i];
    out << "\n";
  }
  return out.str();
}

}  // namespace ddp
