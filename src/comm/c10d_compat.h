// The one place where LibTorch 1.13 and 2.x differ for us (and 2.x's minor
// versions: where a store server can be told to listen; how autocast's
// thread-local state is named). Everything else in
// libddp includes this header instead of naming c10d's base classes directly.
//
//   1.13: ProcessGroupGloo/NCCL derive from c10d::ProcessGroup, and the
//         backend-specific Options derive from ProcessGroup::Options.
//   2.x:  they derive from c10d::Backend (ProcessGroup became a dispatcher
//         over backends), Options from Backend::Options.
#pragma once
// (And one rule of DDP's that 2.x changed: kFirstBucketFollowsGivenCap.)

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace ddp::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

using Work = c10d::Work;

// TCPStore's options grew fields in 2.x (libuv, master listen fd); the ones
// set here exist in both. A server is made by store_bind::serve_tcp_store
// (store_bind.h), which also decides where it listens.
inline c10d::TCPStoreOptions tcp_store_options(uint16_t port, bool is_server, int world_size,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.numWorkers = world_size;
  opts.waitWorkers = false;  // rank 0 must not block here; the backend's own handshake waits for everyone
  opts.timeout = timeout;
  return opts;
}

// Where a store server listens (store_bind.cpp): from 2.8 on, c10d takes a
// socket we bound (TCPStoreOptions::masterListenFd); before, it binds the
// wildcard address itself, and store_bind.cpp substitutes our socket.
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 8)
#define DDP_STORE_BIND_SUBSTITUTION 1
#else
// Hands the listening socket `fd` to the server `opts` makes; it owns it from then on.
inline void set_master_listen_fd(c10d::TCPStoreOptions& opts, int fd) { opts.masterListenFd = fd; }
#endif

// 1.13's TCPStore client starts a thread for watchKey() callbacks on a second
// connection (2.x's has none). Once its server is gone that thread spins on
// the closed socket, and on a reset one it throws out of its thread
// (std::terminate): store_client.cpp stops it after connecting.
inline constexpr bool kStoreClientHasCallbackThread = TORCH_VERSION_MAJOR < 2;

// Autocast's thread-local switches, per device type. 2.4 replaced the
// per-device functions (set_cpu_enabled, set_autocast_gpu_dtype, ...) with
// ones that take the device type; 1.13 has only the CPU and CUDA ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
inline void set_autocast_enabled(c10::DeviceType type, bool on) { at::autocast::set_autocast_enabled(type, on); }
inline at::ScalarType autocast_dtype(c10::DeviceType type) { return at::autocast::get_autocast_dtype(type); }
inline void set_autocast_dtype(c10::DeviceType type, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
inline bool autocast_enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
inline void set_autocast_enabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
inline at::ScalarType autocast_dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType type, at::ScalarType dtype) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

// PyTorch 2.x's DDP gives the first bucket the caller's bucket_cap_mb when
// one was passed (dist._DEFAULT_FIRST_BUCKET_BYTES only with the default
// cap; torch/nn/parallel/distributed.py); 1.13's always the 1 MiB default.
constexpr bool kFirstBucketFollowsGivenCap = TORCH_VERSION_MAJOR >= 2;

// Whether an exception a c10d call threw is the backend failing (NCCL's
// communicator made lazily inside the first collective, its store, its
// network), not a refusal of the call's arguments. 2.x throws those as
// c10::DistBackendError; 1.13 (CPU: Gloo only, which starts nothing at the
// call) has no such type and no such failure at the call.
#if TORCH_VERSION_MAJOR >= 2
inline bool is_backend_failure(const std::exception& e) {
  return dynamic_cast<const c10::DistBackendError*>(&e) != nullptr;
}
#else
inline bool is_backend_failure(const std::exception&) { return false; }
#endif

// A backend's normal exit before it is let go: 2.x's NCCL expects
// Backend::shutdown() (without it, its destructor warns that
// destroy_process_group() was not called, and at exit may run after the CUDA
// runtime has begun unloading); 1.13's backends have no such call.
#if TORCH_VERSION_MAJOR >= 2
inline void shutdown_backend(Backend& backend) { backend.shutdown(); }
#else
inline void shutdown_backend(Backend&) {}
#endif

// Aborts the backend's communicators from any thread (NCCL's
// ncclCommAbort): 2.x's Backend::abort(); 1.13 has no NCCL here and no such
// call.
#if TORCH_VERSION_MAJOR >= 2
inline void abort_backend(Backend& backend) { backend.abort(); }
#else
inline void abort_backend(Backend&) {}
#endif

// _amp_foreach_non_finite_check_and_unscale_ has a CPU kernel from 2.3 on
// (GradScaler("cpu")); before, on CUDA only.
constexpr bool kAmpUnscaleKernelOnCpu =
    TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3);

// The variable that turns on NCCL's asynchronous error handling: LibTorch
// 2.2 renamed it and warns at every start that the old name is deprecated.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
constexpr const char* kNcclAsyncErrorHandling = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
constexpr const char* kNcclAsyncErrorHandlingOtherName = "NCCL_ASYNC_ERROR_HANDLING";
#else
constexpr const char* kNcclAsyncErrorHandling = "NCCL_ASYNC_ERROR_HANDLING";
constexpr const char* kNcclAsyncErrorHandlingOtherName = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
#endif

// 2.x's Gloo worker threads name themselves ("pt_gloo_runloop") once they
// run, which can land after our rename (comm_threads.cpp waits for it).
constexpr bool kGlooWorkersNameThemselves = TORCH_VERSION_MAJOR >= 2;

// NCCL's grouped start of several sends and receives (batch_isend_irecv).
// 1.13's endCoalescing takes the requests started in the group; 2.x's
// returns one Work for the whole group (the calls in it return none), which
// end_coalescing hands back (null in 1.13).
inline void start_coalescing(Backend& backend) { backend.startCoalescing(); }
#if TORCH_VERSION_MAJOR >= 2
inline c10::intrusive_ptr<Work> end_coalescing(Backend& backend, std::vector<c10::intrusive_ptr<Work>>&) {
  return backend.endCoalescing();
}
#else
inline c10::intrusive_ptr<Work> end_coalescing(Backend& backend, std::vector<c10::intrusive_ptr<Work>>& reqs) {
  backend.endCoalescing(reqs);
  return {};
}
#endif

}  // namespace ddp::compat
