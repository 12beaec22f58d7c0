// The library's errors: one family, so a program can catch ddp::Error for
// everything libddp reports, or one kind to handle it differently. Each is
// also a c10::Error, as LibTorch's own errors are, so a LibTorch program's
// `catch (const c10::Error&)` (or `std::exception`) sees ours too; a
// communication failure is a c10::DistBackendError where LibTorch has that
// type (2.x), as PyTorch 2.x raises. what() is the message alone, without
// the C++ backtrace c10::Error adds. Every message says what happened, on
// which rank (when a rank is known), and what to do. TORCH_CHECK and a bare
// c10::Error remain for internal invariants only: one of those is a bug in
// libddp, not in the program using it.
//
// ddprun links no LibTorch: it builds the Torch-free pieces it shares with
// the library (the launch environment, host lists) with
// DDP_ERRORS_TORCH_FREE, where the same names are std::runtime_errors in a
// namespace of their own.
#pragma once

#include <string>

#if defined(DDP_ERRORS_TORCH_FREE)
#include <stdexcept>
#else
#include <c10/util/Exception.h>
#include <torch/version.h>
#endif

namespace ddp {
#if defined(DDP_ERRORS_TORCH_FREE)
inline namespace torch_free {
#endif

// Everything libddp throws on purpose: catch (const ddp::Error& e), then
// e.what(). Each concrete error below is also a c10::Error.
class Error {
 public:
  virtual ~Error() = default;
  virtual const char* what() const noexcept = 0;
  // The status guarded_main() exits with for it (ddp/runtime/main_guard.h):
  // 1, 2 for a UsageError, kPreemptedExitCode for the training kit's
  // Preempted (ddp/train/errors.h).
  virtual int exit_code() const noexcept { return 1; }

 protected:
  Error() = default;
  Error(const Error&) = default;
  Error& operator=(const Error&) = default;
};

namespace error_bases {

#if defined(DDP_ERRORS_TORCH_FREE)
using ErrorBase = std::runtime_error;
using CommErrorBase = std::runtime_error;
#else
using ErrorBase = c10::Error;
#if TORCH_VERSION_MAJOR >= 2
using CommErrorBase = c10::DistBackendError;
#else
using CommErrorBase = c10::Error;  // LibTorch 1.13 has no DistBackendError
#endif
#endif

// One of our errors on top of LibTorch's error type Base.
template <typename Base>
class ErrorOf : public Base, public Error {
 public:
#if defined(DDP_ERRORS_TORCH_FREE)
  explicit ErrorOf(const std::string& message) : Base(message) {}
  const char* what() const noexcept override { return Base::what(); }
#else
  // No backtrace: what() is the message, as our messages say all there is.
  explicit ErrorOf(const std::string& message) : Base(message, {}) {}
  const char* what() const noexcept override { return this->what_without_backtrace(); }
#endif
};

}  // namespace error_bases

// The program asked for something that cannot work: an invalid option
// (bucket_cap_mb(0), an unknown backend), a bad command line, a model that
// DistributedDataParallel cannot wrap or that differs across ranks. Thrown
// where the value is made, before any collective when it can be.
// guarded_main() exits with status 2 for it.
class UsageError : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
  int exit_code() const noexcept override { return 2; }
};

// A missing, malformed or inconsistent launch variable (RANK, WORLD_SIZE,
// MASTER_PORT, SLURM_*, OMPI_*, a Slurm host list).
class LaunchEnvError : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

// A collective, the rendezvous store or a backend's connection failed or
// timed out; the message names the rank, the operation and the backend.
// A c10::DistBackendError against LibTorch 2.x.
class CommError : public error_bases::ErrorOf<error_bases::CommErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

// ddp::Join with throw_on_early_termination: a rank ran out of inputs, and
// every rank stops (ddp/parallel/join.h). As PyTorch's RuntimeError there.
class UnevenInputsError : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

// A missing, unreadable or malformed data file; the message names the file,
// what is wrong with it and what to do.
class DataError : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

// A checkpoint or state-dict file that is not what it should be (truncated,
// foreign, corrupt, from another model), or one that could not be written.
class CheckpointError : public error_bases::ErrorOf<error_bases::ErrorBase> {
 public:
  using ErrorOf::ErrorOf;
};

#if defined(DDP_ERRORS_TORCH_FREE)
}  // namespace torch_free
#endif

// The status of a program that stopped for a batch system's preemption
// warning after saving what it needs to resume (the training kit's
// Preempted), which ddprun and the job templates in deploy/slurm/ requeue
// on: EX_TEMPFAIL of sysexits.h, "a temporary failure; try again later".
constexpr int kPreemptedExitCode = 75;

}  // namespace ddp
