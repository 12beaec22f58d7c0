// The outermost frame of a training program: runs its body and turns an
// escaping exception into one line on stderr that names this rank, and a
// non-zero exit status (2 for a ddp::UsageError: a bad command line or option,
// a model DDP cannot wrap or that differs across ranks; 1 for anything else),
// so a launcher sees which rank failed and why. A ddp::Preempted (the program
// checkpointed on a preemption warning) exits with kPreemptedExitCode (75).
//
//   int main(int argc, char** argv) {
//     return ddp::guarded_main([&] { ... return 0; });
//   }
#pragma once

#include <functional>

namespace ddp {

int guarded_main(const std::function<int()>& body);

}  // namespace ddp
