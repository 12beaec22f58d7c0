#include "ddp/comm/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>

#include "comm/c10d_compat.h"
#include "comm/c10d_process_group.h"
#include "comm/store_client.h"
#include "comm/comm_threads.h"
#include "comm/gpu_ranks.h"
#include "comm/backend_groups.h"
#include "comm/before_shutdown.h"
#include "comm/work_handle.h"
#include "runtime/parse_number.h"
#include "comm/process_group_mpi.h"
#include "comm/store_bind.h"

#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ddp {

// ---- the group made here ----------------------------------------------------

namespace {

std::mutex g_mutex;
std::shared_ptr<ProcessGroup> g_default;
std::vector<std::weak_ptr<ProcessGroup>> g_made;  // every group init_process_group made here
int g_generation = 0;  // a fresh store prefix for each group made in this process
std::map<std::string, std::shared_ptr<ProcessGroup>> g_beside;  // job_group_of_backend's, by backend
LaunchEnv g_launch_env;  // what the default group was made from, for the groups beside it

struct BeforeShutdown {
  std::weak_ptr<ProcessGroup> group;
  std::function<void()> fn;
};
std::vector<BeforeShutdown> g_before_shutdown;  // under g_mutex

// At exit, every group still up is shut down. The handler is registered
// after the first group's backend was made (and with it, under NCCL, the
// CUDA runtime initialized), so it runs before the runtime's own teardown
// and before static destructors: a program that returns from main without
// destroy_process_group() ends as cleanly as one that calls it.
void shut_down_at_exit() {
  std::vector<std::shared_ptr<ProcessGroup>> up;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& weak : g_made)
      if (auto group = weak.lock()) up.push_back(std::move(group));
    g_made.clear();
    g_default.reset();
    g_beside.clear();
  }
  for (auto it = up.rbegin(); it != up.rend(); ++it) {
    try {
      detail::run_before_shutdown(**it);
      (*it)->shutdown();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "libddp: rank %d: shutting the %s process group down at exit: %s\n", (*it)->rank(),
                   (*it)->backend_name().c_str(), e.what());
    }
  }
}

// Makes `group` the default group, shut down at exit if still up then.
std::shared_ptr<ProcessGroup> adopt(std::shared_ptr<ProcessGroup> group) {
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(shut_down_at_exit); });
  std::lock_guard<std::mutex> lock(g_mutex);
  g_default = group;
  g_made.push_back(group);
  return group;
}

// Rank 0 writes its job's id into the store it serves; every other rank
// reads it and refuses a store of another job (two jobs on one node that
// chose the same port), at once instead of training with strangers.
void check_same_job(c10d::Store& store, const LaunchEnv& env, const std::string& who,
                    std::chrono::milliseconds timeout) {
  const std::string key = "ddp_job_id";
  if (env.rank == 0) {
    store.set(key, std::vector<uint8_t>(env.job_id.begin(), env.job_id.end()));
    return;
  }
  std::vector<uint8_t> theirs;
  try {
    store.wait({key}, timeout);
    theirs = store.get(key);
  } catch (const std::exception& e) {
    throw CommError(who + "rank 0 of this job never said which job it is (" + e.what() + ")");
  }
  const std::string owner(theirs.begin(), theirs.end());
  if (owner != env.job_id)
    throw CommError(who + "the rendezvous store at " + env.master_addr + ":" + std::to_string(env.master_port) +
                    " belongs to job " + owner + ", not to this job (" + env.job_id +
                    "): two jobs chose the same MASTER_ADDR and MASTER_PORT. Give each job its own MASTER_PORT, "
                    "or leave it unset so that it comes from the job id");
}

std::string this_host() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "?";
}

// Rank 0 serves the store on MASTER_ADDR's address (store_bind.h), and says
// which of MASTER_ADDR, MASTER_PORT or the machine is wrong when it cannot.
c10::intrusive_ptr<c10d::Store> serve_store(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                            const std::string& who) {
  const std::string at = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    auto served = store_bind::serve_tcp_store(
        env.master_addr, compat::tcp_store_options(env.master_port, true, env.world_size, timeout));
    if (!served.notice.empty()) std::cerr << who << "MASTER_ADDR " << served.notice << std::endl;
    return served.store;
  } catch (const store_bind::ListenError& e) {
    using Kind = store_bind::ListenError::Kind;
    switch (e.kind()) {
      case Kind::Unresolved:
        throw CommError(who + "cannot serve the rendezvous store: MASTER_ADDR " + e.what() +
                        "; set MASTER_ADDR to rank 0's host name or IP address, as every rank can resolve it");
      case Kind::NotLocal:
        throw CommError(who + "cannot serve the rendezvous store: MASTER_ADDR " + e.what() +
                        "; rank 0 serves the store, so MASTER_ADDR must be an address of rank 0's host (this is " +
                        "host " + this_host() + ")");
      case Kind::InUse:
        throw CommError(who + "cannot serve the rendezvous store at " + at + ": " + e.what() +
                        "; choose another MASTER_PORT, or stop the process that holds it");
      case Kind::Other: break;
    }
    throw CommError(who + "cannot serve the rendezvous store at " + at + ": " + e.what());
  } catch (const std::exception& e) {
    throw CommError(who + "cannot serve the rendezvous store at " + at + ": " + e.what());
  }
}

c10::intrusive_ptr<c10d::Store> join_store(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                           const std::string& who) {
  try {
    return store_client::connect_bounded(env.master_addr,
                                         compat::tcp_store_options(env.master_port, false, env.world_size, timeout));
  } catch (const std::exception& e) {
    throw CommError(who + "could not reach the rendezvous store at " + env.master_addr + ":" +
                    std::to_string(env.master_port) + ": " + e.what() +
                    "\n  (is rank 0 running, and is MASTER_ADDR reachable from this host?)");
  }
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

#ifdef USE_C10D_GLOO
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

// tcp://HOST:PORT names rank 0's store in place of MASTER_ADDR and
// MASTER_PORT; env:// keeps the launch environment's.
void apply_init_method(const std::string& init, const std::string& who, LaunchEnv& env) {
  if (init.rfind("tcp://", 0) == 0) {
    std::string hostport = init.substr(6);
    size_t colon = hostport.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw UsageError(who + "init_method '" + init + "' must be tcp://HOST:PORT");
    env.master_addr = hostport.substr(0, colon);
    const auto port = parse_integer(hostport.substr(colon + 1), 1, 65535);
    if (!port) throw UsageError(who + "init_method '" + init + "' has no valid port (1-65535)");
    env.master_port = static_cast<uint16_t>(*port);
  } else if (init != "env://") {
    throw UsageError(who + "init_method '" + init + "' is not supported; use env:// or tcp://HOST:PORT");
  }
}

// "auto": nccl where a GPU is visible, else gloo.
std::string chosen_backend(const ProcessGroupOptions& options, const std::string& who) {
  std::string backend = options.backend();
  if (backend == "auto") backend = has_gpu() ? "nccl" : "gloo";
  if (backend != "gloo" && backend != "nccl" && backend != "mpi")
    throw UsageError(who + "unknown backend '" + backend + "'; use auto, gloo, nccl or mpi");
  return backend;
}

// The mpi backend: our own group, on a process that Open MPI's mpirun started.
std::shared_ptr<ProcessGroup> make_mpi_group([[maybe_unused]] const LaunchEnv& env,
                                             [[maybe_unused]] std::chrono::milliseconds timeout,
                                             const std::string& who) {
#ifdef DDP_WITH_MPI
  if (env.source != LaunchEnv::Source::OpenMPI)
    throw UsageError(who + "the mpi backend needs a process started by Open MPI's mpirun, and this one was not "
                     "(no OMPI_COMM_WORLD_RANK in its environment; its launch environment is '" + env.source_name() +
                     "'): run mpirun -np N ./program, or choose the gloo backend");
  torch::Device device(torch::kCPU);
#ifdef DDP_WITH_CUDA
  // CUDA tensors are staged through host memory (process_group_mpi.cpp).
  if (has_gpu()) {
    const auto index = static_cast<c10::DeviceIndex>(env.local_rank % torch::cuda::device_count());
    c10::cuda::set_device(index);
    device = torch::Device(torch::kCUDA, index);
  }
#endif
  return detail::make_mpi_process_group(env, timeout, device, who);
#else
  throw UsageError(who + "the mpi backend is not compiled into this libddp (CMake found no MPI when it was "
                   "built, or it was configured with -DDDP_WITH_MPI=OFF): install Open MPI (Debian: libopenmpi-dev "
                   "openmpi-bin) and rebuild, or choose the gloo backend");
#endif
}

// An mpirun job across hosts without MASTER_ADDR (LaunchEnv left it
// empty): rank 0's address, and each rank's interface towards it, are
// learned over MPI itself. The interface, or "" when MASTER_ADDR was set.
std::string learn_master_if_unset(LaunchEnv& env, [[maybe_unused]] std::chrono::milliseconds timeout,
                                  const std::string& who) {
  std::string learned_interface;
  if (env.master_addr.empty()) {
#ifdef DDP_WITH_MPI
    const auto route = detail::learn_master_route_over_mpi(timeout, who);
    env.master_addr = route.master_addr;
    learned_interface = route.interfaces.at(static_cast<size_t>(env.rank));
#else
    throw LaunchEnvError(who + "MASTER_ADDR is not set; set it to the host of rank 0 on every rank");
#endif
  }
  return learned_interface;
}

// The rendezvous store (rank 0 serves it, the others join), and the group's
// view of it under a prefix of its own: the job's id and a fresh generation.
struct GroupStore {
  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
  c10::intrusive_ptr<c10d::Store> prefixed;
};

// `store` under a fresh prefix of this process's groups (the same on every
// rank, which makes its groups in the same order).
GroupStore prefixed_store(c10::intrusive_ptr<c10d::Store> store, const LaunchEnv& env) {
  GroupStore out;
  out.store = std::move(store);
  int generation;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    generation = g_generation++;
  }
  out.prefix = "ddp_pg_" + (env.job_id.empty() ? std::string() : env.job_id + "_") + std::to_string(generation);
  out.prefixed = c10::make_intrusive<c10d::PrefixStore>(out.prefix, out.store);
  return out;
}

GroupStore group_store(const LaunchEnv& env, std::chrono::milliseconds timeout, const std::string& who) {
  auto store = env.rank == 0 ? serve_store(env, timeout, who) : join_store(env, timeout, who);
  if (!env.job_id.empty()) check_same_job(*store, env, who, timeout);
  return prefixed_store(std::move(store), env);
}

c10::intrusive_ptr<compat::Backend> connect_gloo([[maybe_unused]] const c10::intrusive_ptr<c10d::Store>& prefixed,
                                                 [[maybe_unused]] const LaunchEnv& env,
                                                 [[maybe_unused]] std::chrono::milliseconds timeout,
                                                 [[maybe_unused]] const std::string& learned_interface,
                                                 [[maybe_unused]] detail::GlooDevices& gloo_devices) {
#ifdef USE_C10D_GLOO
  // The device starts Gloo's event-loop thread, the group its workers:
  // found by the threads each adds, named, and the loop moved to
  // SCHED_IDLE when asked (comm_threads.h says why).
  const bool idle_loop = detail::gloo_loop_idle_from_environment(env.rank);
  const auto before_device = detail::thread_ids();
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(gloo_device(env, learned_interface));
  gloo_devices = opts->devices;
  const auto before_group = detail::thread_ids();
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world_size, opts);
  for (pid_t tid : detail::new_threads(before_device, before_group))
    detail::tune_comm_thread(tid, "gloo-loop", idle_loop);
  for (pid_t tid : detail::new_threads(before_group, detail::thread_ids()))
    detail::tune_comm_thread(tid, "gloo-worker", false, compat::kGlooWorkersNameThemselves);
  return pg;
#else
  throw UsageError("this LibTorch was built without Gloo");
#endif
}

// NCCL on this rank's GPU, which becomes the group's device.
c10::intrusive_ptr<compat::Backend> connect_nccl([[maybe_unused]] const c10::intrusive_ptr<c10d::Store>& prefixed,
                                                 [[maybe_unused]] const LaunchEnv& env,
                                                 [[maybe_unused]] std::chrono::milliseconds timeout,
                                                 [[maybe_unused]] int gpu, [[maybe_unused]] torch::Device& device) {
#ifdef USE_C10D_NCCL
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(gpu));
  device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world_size, opts);
#else
  throw UsageError("this build has no NCCL (LibTorch without CUDA); use --backend gloo");
#endif
}

}  // namespace

ProcessGroupOptions& ProcessGroupOptions::backend(std::string name) {
  if (name != "auto" && name != "gloo" && name != "nccl" && name != "mpi")
    throw UsageError("ProcessGroupOptions: unknown backend '" + name + "'; use auto, gloo, nccl or mpi");
  backend_ = std::move(name);
  return *this;
}

ProcessGroupOptions& ProcessGroupOptions::timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    throw UsageError("ProcessGroupOptions: the timeout must be positive, got " + std::to_string(timeout.count()) +
                     " ms");
  timeout_ = timeout;
  return *this;
}

ProcessGroupOptions& ProcessGroupOptions::init_method(std::string method) {
  if (method != "env://" && method.rfind("tcp://", 0) != 0)
    throw UsageError("ProcessGroupOptions: init_method '" + method + "' is not supported; use env:// or tcp://HOST:PORT");
  init_method_ = std::move(method);
  return *this;
}

std::string rank_tag(const ProcessGroup& pg) {
  return "rank " + std::to_string(pg.rank()) + "/" + std::to_string(pg.size());
}

std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  return init_process_group(LaunchEnv::from_environment(), options);
}

std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env_in, const ProcessGroupOptions& options) {
  LaunchEnv env = env_in;
  const std::string who = "rank " + std::to_string(env.rank) + ": init_process_group: ";
  apply_init_method(options.init_method(), who, env);
  const std::string backend = chosen_backend(options, who);
  const auto timeout = options.timeout();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_launch_env = env;
  }
  [[maybe_unused]] int gpu = -1;
  if (backend == "nccl") {
    if (!has_gpu()) throw UsageError(who + "the nccl backend needs a GPU and none is visible");
    gpu = detail::gpu_of_rank(env, visible_gpus(), options.backend(), who);
    set_nccl_async_error_handling();
  }
  if (backend == "mpi") return adopt(make_mpi_group(env, timeout, who));

  const std::string learned_interface = learn_master_if_unset(env, timeout, who);
  const GroupStore store = group_store(env, timeout, who);
  torch::Device device(torch::kCPU);
  c10::intrusive_ptr<compat::Backend> pg;
  detail::GlooDevices gloo_devices;
  try {
    if (backend == "gloo")
      pg = connect_gloo(store.prefixed, env, timeout, learned_interface, gloo_devices);
    else
      pg = connect_nccl(store.prefixed, env, timeout, gpu, device);
  } catch (const UsageError& e) {
    throw UsageError(who + e.what());
  } catch (const std::exception& e) {
    throw CommError(who + backend + " could not connect all " + std::to_string(env.world_size) +
                    " ranks within the timeout: " + e.what() +
                    "\n  (check that every rank was started, and GLOO_SOCKET_IFNAME when hosts have several interfaces)");
  }
  return adopt(std::make_shared<detail::C10dProcessGroup>(store.store, pg, backend, device, timeout, store.prefix,
                                                          std::move(gloo_devices)));
}

std::string mpi_library_version() {
#ifdef DDP_WITH_MPI
  return detail::mpi_library_version_text();
#else
  return "";
#endif
}

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_default)
    throw UsageError("no default process group: call ddp::init_process_group() first");
  return g_default;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<bool>(g_default);
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> last;
  std::map<std::string, std::shared_ptr<ProcessGroup>> beside;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    last.swap(g_default);
    beside.swap(g_beside);
  }
  // Outside the lock: a backend's shutdown may block briefly.
  for (auto& [name, group] : beside) {
    detail::run_before_shutdown(*group);
    group->shutdown();
  }
  if (!last) return;
  detail::run_before_shutdown(*last);
  last->shutdown();
}

namespace {

// The rendezvous store for a group beside the default one: the default
// group's own (under a prefix of its own), or, beside an mpi group, which has
// none, one that rank 0 serves at MASTER_ADDR:MASTER_PORT.
GroupStore store_beside(ProcessGroup& world, LaunchEnv& env, std::chrono::milliseconds timeout,
                        const std::string& who, std::string& learned_interface) {
  if (auto handle = world.store()) return prefixed_store(handle->get(), env);
  learned_interface = learn_master_if_unset(env, timeout, who);
  return group_store(env, timeout, who);
}

std::shared_ptr<ProcessGroup> connect_beside(ProcessGroup& world, const std::string& backend,
                                             std::chrono::milliseconds timeout, const std::string& who) {
  LaunchEnv env;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    env = g_launch_env;  // the default group's, with its master and job id
  }
  if (env.rank != world.rank() || env.world_size != world.size())
    throw UsageError(who + "the default group (rank " + std::to_string(world.rank()) + " of " +
                     std::to_string(world.size()) + ") was not made by init_process_group; make it with "
                     "init_process_group before asking for a group of another backend beside it");
  if (backend == "mpi") return make_mpi_group(env, timeout, who);
  [[maybe_unused]] int gpu = -1;
  if (backend == "nccl") {
    if (!has_gpu()) throw UsageError(who + "the nccl backend needs a GPU and none is visible");
    gpu = detail::gpu_of_rank(env, visible_gpus(), "nccl", who);
    set_nccl_async_error_handling();
  }
  std::string learned_interface;
  const GroupStore store = store_beside(world, env, timeout, who, learned_interface);
  torch::Device device(torch::kCPU);
  detail::GlooDevices gloo_devices;
  c10::intrusive_ptr<compat::Backend> pg;
  try {
    pg = backend == "gloo" ? connect_gloo(store.prefixed, env, timeout, learned_interface, gloo_devices)
                           : connect_nccl(store.prefixed, env, timeout, gpu, device);
  } catch (const UsageError& e) {
    throw UsageError(who + e.what());
  } catch (const std::exception& e) {
    throw CommError(who + backend + " could not connect all " + std::to_string(env.world_size) +
                    " ranks within the timeout: " + e.what() +
                    "\n  (every rank must call new_group with this backend)");
  }
  return std::make_shared<detail::C10dProcessGroup>(store.store, pg, backend, device, timeout, store.prefix,
                                                    std::move(gloo_devices));
}

}  // namespace

namespace detail {

std::shared_ptr<ProcessGroup> job_group_of_backend(const std::string& backend, std::chrono::milliseconds timeout) {
  const auto world = default_process_group();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto it = g_beside.find(backend);
    if (it != g_beside.end()) return it->second;
  }
  const std::string who = "rank " + std::to_string(world->rank()) + ": dist.new_group(backend=\"" + backend + "\"): ";
  auto made = connect_beside(*world, backend, timeout, who);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_beside[backend] = made;
  g_made.push_back(made);
  return made;
}

}  // namespace detail

namespace detail {

void before_shutdown(const std::shared_ptr<ProcessGroup>& group, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_before_shutdown.erase(std::remove_if(g_before_shutdown.begin(), g_before_shutdown.end(),
                                         [](const BeforeShutdown& b) { return b.group.expired(); }),
                          g_before_shutdown.end());
  g_before_shutdown.push_back({group, std::move(fn)});
}

void run_before_shutdown(const ProcessGroup& group) {
  std::vector<std::function<void()>> due;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto mine = [&](const BeforeShutdown& b) { return b.group.lock().get() == &group; };
    for (const auto& b : g_before_shutdown)
      if (mine(b)) due.push_back(b.fn);
    g_before_shutdown.erase(std::remove_if(g_before_shutdown.begin(), g_before_shutdown.end(), mine),
                            g_before_shutdown.end());
  }
  for (auto& fn : due) fn();
}

}  // namespace detail

}  // namespace ddp
