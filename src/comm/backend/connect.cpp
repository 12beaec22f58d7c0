#include "comm/backend/connect.h"

#include <cctype>
#include <cstdlib>

#include "comm/backend/c10d_process_group.h"
#include "comm/backend/comm_threads.h"
#include "comm/backend/gpu_ranks.h"
#include "comm/backend/process_group_mpi.h"
#include "comm/c10d_compat.h"
#include "comm/store/group_store.h"
#include "ddp/errors.h"

#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ddp::detail {

namespace {

#ifdef USE_C10D_GLOO
bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// `learned_interface`: this rank's interface on the subnet that joins it to
// rank 0, when that was learned over MPI (an mpirun job without MASTER_ADDR).
std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnv& env, const std::string& learned_interface) {
  // PyTorch's variable: one interface (or a comma-separated list) to bind.
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    std::string first(ifname);
    first = first.substr(0, first.find(','));
    return c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  if (!learned_interface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(learned_interface);
  // Every rank on this host: loopback needs no name resolution at all.
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  // Else the address this host's name resolves to (loopback if it resolves to nothing).
  return c10d::ProcessGroupGloo::createDefaultDevice();
}
#endif

bool has_gpu() {
#ifdef DDP_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

int visible_gpus() {
#ifdef DDP_WITH_CUDA
  return static_cast<int>(torch::cuda::device_count());
#else
  return 0;
#endif
}

// NCCL's asynchronous error handling (a hung or failed collective ends the
// process instead of hanging it), as torchrun turns it on: under the name
// this LibTorch reads, where the program has not set it. ddprun exports
// 2.x's name; a value under the other name is carried over, so no LibTorch
// warns of a deprecated variable.
void set_nccl_async_error_handling() {
  if (std::getenv(compat::kNcclAsyncErrorHandling)) return;
  const char* other = std::getenv(compat::kNcclAsyncErrorHandlingOtherName);
  ::setenv(compat::kNcclAsyncErrorHandling, other ? other : "1", 0);
}

// The mpi backend: our own group, on a process that Open MPI's mpirun started.
#ifdef DDP_WITH_MPI
std::shared_ptr<ProcessGroup> make_mpi_group(const BackendRequest& request) {
  const LaunchEnv& env = request.env;
  if (env.source != LaunchEnv::Source::OpenMPI)
    throw UsageError(request.who + "the mpi backend needs a process started by Open MPI's mpirun, and this one was "
                     "not (no OMPI_COMM_WORLD_RANK in its environment; its launch environment is '" +
                     env.source_name() + "'): run mpirun -np N ./program, or choose the gloo backend");
  torch::Device device(torch::kCPU);
#ifdef DDP_WITH_CUDA
  // CUDA tensors are staged through host memory (process_group_mpi.cpp).
  if (has_gpu()) {
    const auto index = static_cast<c10::DeviceIndex>(env.local_rank % torch::cuda::device_count());
    c10::cuda::set_device(index);
    device = torch::Device(torch::kCUDA, index);
  }
#endif
  return make_mpi_process_group(env, request.timeout, device, request.who);
}

// An mpirun job across hosts without MASTER_ADDR (LaunchEnv left it
// empty): rank 0's address, and each rank's interface towards it, are
// learned over MPI itself. The interface, or "" when MASTER_ADDR was set.
std::string learn_master_if_unset(BackendRequest& request) {
  if (!request.env.master_addr.empty()) return "";
  const auto route = learn_master_route_over_mpi(request.timeout, request.who);
  request.env.master_addr = route.master_addr;
  return route.interfaces.at(static_cast<size_t>(request.env.rank));
}
#else
std::shared_ptr<ProcessGroup> make_mpi_group(const BackendRequest& request) {
  throw UsageError(request.who + "the mpi backend is not compiled into this libddp (CMake found no MPI when it "
                   "was built, or it was configured with -DDDP_WITH_MPI=OFF): install Open MPI (Debian: "
                   "libopenmpi-dev openmpi-bin) and rebuild, or choose the gloo backend");
}

std::string learn_master_if_unset(const BackendRequest& request) {
  if (request.env.master_addr.empty())
    throw LaunchEnvError(request.who + "MASTER_ADDR is not set; set it to the host of rank 0 on every rank");
  return "";
}
#endif

// A c10d backend, made; with the device it runs on and, for Gloo, the
// transport devices its subgroups reuse.
struct Connected {
  c10::intrusive_ptr<compat::Backend> backend;
  torch::Device device = torch::kCPU;
  GlooDevices gloo_devices;
};

#ifdef USE_C10D_GLOO
Connected connect_gloo(const GroupStore& store, const BackendRequest& request, const std::string& learned_interface) {
  // The device starts Gloo's event-loop thread, the group its workers:
  // found by the threads each adds, named, and the loop moved to
  // SCHED_IDLE when asked (comm_threads.h says why).
  const LaunchEnv& env = request.env;
  const bool idle_loop = gloo_loop_idle_from_environment(env.rank);
  const auto before_device = thread_ids();
  auto opts = c10d::ProcessGroupGloo::Options::create(request.timeout);
  opts->devices.push_back(gloo_device(env, learned_interface));
  const auto before_group = thread_ids();
  Connected out;
  out.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store.prefixed, env.rank, env.world_size, opts);
  out.gloo_devices = opts->devices;
  for (pid_t tid : new_threads(before_device, before_group))
    tune_comm_thread(tid, "gloo-loop", idle_loop);
  for (pid_t tid : new_threads(before_group, thread_ids()))
    tune_comm_thread(tid, "gloo-worker", false, compat::kGlooWorkersNameThemselves);
  return out;
}
#else
Connected connect_gloo(const GroupStore&, const BackendRequest&, const std::string&) {
  throw UsageError("this LibTorch was built without Gloo");
}
#endif

// NCCL on this rank's GPU, which becomes the group's device.
#ifdef USE_C10D_NCCL
Connected connect_nccl(const GroupStore& store, const BackendRequest& request, int gpu) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(gpu));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = request.timeout;
  Connected out;
  out.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu));
  out.backend =
      c10::make_intrusive<c10d::ProcessGroupNCCL>(store.prefixed, request.env.rank, request.env.world_size, opts);
  return out;
}
#else
Connected connect_nccl(const GroupStore&, const BackendRequest&, int) {
  throw UsageError("this build has no NCCL (LibTorch without CUDA); use --backend gloo");
}
#endif

// The store the group meets on: beside a group that has one, that group's
// under a fresh prefix; else the job's (served or joined), once rank 0's
// address is known. `learned_interface`: see learn_master_if_unset.
GroupStore store_for(BackendRequest& request, std::string& learned_interface) {
  if (request.store) return prefixed_store(request.store->get(), request.env, request.generation);
  if (request.beside)
    if (auto handle = request.beside->store()) return prefixed_store(handle->get(), request.env, request.generation);
  learned_interface = learn_master_if_unset(request);
  return group_store(request.env, request.timeout, request.generation, request.who);
}

}  // namespace

std::string parse_backend_name(const std::string& name, bool auto_allowed, const std::string& who) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "gloo" || lower == "nccl" || lower == "mpi" || (auto_allowed && lower == "auto")) return lower;
  throw UsageError(who + "unknown backend '" + name + "'; use " + (auto_allowed ? "auto, " : "") +
                   "gloo, nccl or mpi");
}

std::string resolve_backend(const std::string& parsed) {
  if (parsed != "auto") return parsed;
  return has_gpu() ? "nccl" : "gloo";
}

std::shared_ptr<ProcessGroup> connect_backend(BackendRequest request) {
  const std::string& who = request.who;
  int gpu = -1;
  if (request.backend == "nccl") {
    if (!has_gpu()) throw UsageError(who + "the nccl backend needs a GPU and none is visible");
    gpu = gpu_of_rank(request.env, visible_gpus(), request.asked, who);
    set_nccl_async_error_handling();
  }
  if (request.backend == "mpi") return make_mpi_group(request);
  std::string learned_interface;
  const GroupStore store = store_for(request, learned_interface);
  Connected made;
  try {
    made = request.backend == "gloo" ? connect_gloo(store, request, learned_interface)
                                     : connect_nccl(store, request, gpu);
  } catch (const UsageError& e) {
    throw UsageError(who + e.what());
  } catch (const std::exception& e) {
    throw CommError(who + request.backend + " could not connect all " + std::to_string(request.env.world_size) +
                    " ranks within the timeout: " + e.what() +
                    (request.beside ? "\n  (every rank must call new_group with this backend)"
                                    : "\n  (check that every rank was started, and GLOO_SOCKET_IFNAME when hosts "
                                      "have several interfaces)"));
  }
  return std::make_shared<C10dProcessGroup>(store.store, made.backend, request.backend, made.device, request.timeout,
                                            store.prefix, std::move(made.gloo_devices));
}

}  // namespace ddp::detail
