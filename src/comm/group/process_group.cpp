// init_process_group and its companions (ddp/comm/process_group.h): the
// default group made from the launch environment and kept in the registry,
// the job's groups on other backends beside it, their destruction.
#include "ddp/comm/process_group.h"

#include "comm/backend/connect.h"
#include "comm/backend/process_group_mpi.h"
#include "comm/group/registry.h"
#include "runtime/parse_number.h"

namespace ddp {

namespace {

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

}  // namespace

ProcessGroupOptions& ProcessGroupOptions::backend(std::string name) {
  backend_ = detail::parse_backend_name(name, true, "ProcessGroupOptions: ");
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

std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env, const ProcessGroupOptions& options) {
  auto& registry = detail::GroupRegistry::instance();
  detail::BackendRequest request;
  request.env = env;
  request.who = "rank " + std::to_string(env.rank) + ": init_process_group: ";
  apply_init_method(options.init_method(), request.who, request.env);
  request.asked = options.backend();
  request.backend = detail::resolve_backend(detail::parse_backend_name(request.asked, true, request.who));
  request.timeout = options.timeout();
  request.generation = request.backend == "mpi" ? 0 : registry.next_generation();
  const LaunchEnv made_from = request.env;
  return registry.adopt_default(detail::connect_backend(std::move(request)), made_from);
}

std::string mpi_library_version() {
#ifdef DDP_WITH_MPI
  return detail::mpi_library_version_text();
#else
  return "";
#endif
}

std::shared_ptr<ProcessGroup> default_process_group() {
  auto group = detail::GroupRegistry::instance().default_group();
  if (!group) throw UsageError("no default process group: call ddp::init_process_group() first");
  return group;
}

bool is_initialized() { return static_cast<bool>(detail::GroupRegistry::instance().default_group()); }

void destroy_process_group() { detail::GroupRegistry::instance().destroy(); }

namespace detail {

std::shared_ptr<ProcessGroup> job_group_of_backend(const std::string& backend, std::chrono::milliseconds timeout) {
  const auto world = default_process_group();
  auto& registry = GroupRegistry::instance();
  return registry.beside(backend, [&] {
    BackendRequest request;
    request.backend = request.asked = backend;
    request.env = registry.launch_env();  // the default group's, with its master and job id
    request.timeout = timeout;
    request.who = "rank " + std::to_string(world->rank()) + ": dist.new_group(backend=\"" + backend + "\"): ";
    request.beside = world.get();
    if (request.env.rank != world->rank() || request.env.world_size != world->size())
      throw UsageError(request.who + "the default group (rank " + std::to_string(world->rank()) + " of " +
                       std::to_string(world->size()) + ") was not made by init_process_group; make it with "
                       "init_process_group before asking for a group of another backend beside it");
    request.generation = backend == "mpi" ? 0 : registry.next_generation();
    return connect_backend(std::move(request));
  });
}

}  // namespace detail

}  // namespace ddp
