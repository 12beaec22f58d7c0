// ddp_fuzz's entry points for libFuzzer: the harness named by the program's
// own name (argv[0]'s last part: idx_fuzz, checkpoint_fuzz, ...; see
// harnesses.h) runs on every input.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "harnesses.h"

namespace {

ddp::fuzz::Harness chosen = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const std::string self = *argc > 0 ? (*argv)[0] : "";
  const std::string name = self.substr(self.find_last_of('/') + 1);
  const auto it = ddp::fuzz::harnesses().find(name);
  if (it == ddp::fuzz::harnesses().end()) {
    std::fprintf(stderr, "ddp_fuzz: started as '%s', which names no harness; start it by one of these names (a link "
                 "to this program):\n", name.c_str());
    for (const auto& [known, harness] : ddp::fuzz::harnesses()) std::fprintf(stderr, "  %s\n", known.c_str());
    std::exit(2);
  }
  chosen = it->second;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return chosen(data, size); }
