// The outermost frame of a training program: runs its body and turns an
// escaping exception into one line on stderr that names this rank, and a
// non-zero exit status (2 for a ddp::UsageError: a bad command line or option,
// a model DDP cannot wrap or that differs across ranks; 1 for anything else),
// so a launcher sees which rank failed and why. Under ddprun or torchrun the
// error is also written to the worker's TORCHELASTIC_ERROR_FILE (record_error
// below), and the launcher's failure summary shows it. Any ddp::Error exits
// with its exit_code(): the training kit's ddp::Preempted (the program
// checkpointed on a preemption warning) with kPreemptedExitCode (75).
//
//   int main(int argc, char** argv) {
//     return ddp::guarded_main([&] { ... return 0; });
//   }
#pragma once

#include <exception>
#include <functional>

namespace ddp {

int guarded_main(const std::function<int()>& body);

// What torchrun's @record does for a Python worker, for programs that catch
// their errors themselves instead of using guarded_main: writes `error` to
// the file named by TORCHELASTIC_ERROR_FILE (ddprun and torchrun set it for
// every worker) in torchrun's shape,
//   {"message": {"message": "ddp::CommError: rank 3: ...",
//                "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}
// where the type is the exception's dynamic C++ type, the text is what
// guarded_main prints (labelled with this rank), and py_callstack is the same
// with LibTorch's C++ backtrace when the error carries one. The file is
// replaced atomically (written beside it, then renamed). Returns whether it
// was written: false when the variable is unset or empty, or the file cannot
// be written. Never throws.
bool record_error(const std::exception& error) noexcept;

}  // namespace ddp
