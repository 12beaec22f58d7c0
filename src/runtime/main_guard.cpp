#include "ddp/runtime/main_guard.h"

#include "runtime/atomic_file.h"
#include "runtime/json_text.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <typeinfo>

#include "ddp/errors.h"
#include "ddp/runtime/launch_env.h"

namespace ddp {

namespace {

// RANK is all we can trust before (or after a failed) init_process_group.
std::string rank_prefix() {
  return "rank " + rank_from_environment();
}

// Our own errors already start with "rank N"; LibTorch's carry a C++
// backtrace ("Exception raised from ...") that the one-line message drops.
std::string labelled(const std::string& what) {
  return what.rfind("rank ", 0) == 0 ? what : rank_prefix() + ": " + what;
}
std::string without_backtrace(const std::string& what) {
  const size_t trace = what.find("\nException raised from");
  return trace == std::string::npos ? what : what.substr(0, trace);
}

// "ddp::CommError", "c10::Error", "std::runtime_error".
std::string type_name(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name ? name.get() : mangled;
}

// The launcher reads the file once the worker exits: it sees the old file or
// the whole new one, synced to disk (runtime/atomic_file.h).
bool write_whole_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  return !detail::write_synced_temporary(tmp, text.data(), text.size()) && !detail::rename_synced(tmp, path);
}

}  // namespace

bool record_error(const std::exception& error) noexcept {
  try {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (!path || !*path) return false;
    const std::string type = type_name(error);
    const std::string full = labelled(error.what());
    const std::string json =
        "{\"message\": {\"message\": " + json_string(type + ": " + without_backtrace(full)) +
        ", \"extraInfo\": {\"py_callstack\": " + json_string(type + ": " + full) +
        ", \"timestamp\": \"" + std::to_string(static_cast<long long>(std::time(nullptr))) + "\"}}}\n";
    return write_whole_file(path, json);
  } catch (...) {  // out of memory while reporting an error: the stderr line still comes
    return false;
  }
}

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    const auto* ours = dynamic_cast<const Error*>(&e);
    const int code = ours ? ours->exit_code() : 1;
    record_error(e);  // for a Preempted too: ddprun's summary says why the worker exited 75
    if (code == kPreemptedExitCode)
      std::cerr << e.what() << std::endl;  // a stop on purpose, said as it is
    else if (code == 2)
      std::cerr << rank_prefix() << ": error: " << e.what() << std::endl;  // a UsageError
    else
      std::cerr << "error: " << without_backtrace(labelled(e.what())) << std::endl;
    return code;
  }
}

}  // namespace ddp
