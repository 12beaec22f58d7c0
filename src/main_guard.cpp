#include "ddp/main_guard.h"

#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "ddp/errors.h"
#include "ddp/launch_env.h"

namespace ddp {

namespace {

// RANK is all we can trust before (or after a failed) init_process_group.
std::string rank_prefix() {
  return "rank " + rank_from_environment();
}

}  // namespace

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Preempted& e) {
    std::cerr << e.what() << std::endl;
    return kPreemptedExitCode;
  } catch (const UsageError& e) {
    std::cerr << rank_prefix() << ": error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::string what = e.what();
    // Our own errors already start with "rank N"; LibTorch's carry a C++ backtrace we do not need.
    if (what.rfind("rank ", 0) != 0) what = rank_prefix() + ": " + what;
    const size_t trace = what.find("\nException raised from");
    if (trace != std::string::npos) what = what.substr(0, trace);
    std::cerr << "error: " << what << std::endl;
    return 1;
  }
}

}  // namespace ddp
