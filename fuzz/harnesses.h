// The harnesses of ddp_fuzz, the one program for the readers that link
// libddp: each harness file adds its function to the table by name, and the
// name the program is started by (build-san/fuzz/<harness>, a link to it)
// picks the one that runs (ddp_fuzz_main.cpp). One program compiles
// LibTorch's headers and links LibTorch once for all of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

namespace ddp::fuzz {

// A harness: LLVMFuzzerTestOneInput's body for one reader.
using Harness = int (*)(const uint8_t* data, size_t size);

inline std::map<std::string, Harness>& harnesses() {
  static std::map<std::string, Harness> table;
  return table;
}

struct AddHarness {
  AddHarness(const char* name, Harness harness) {
    if (!harnesses().emplace(name, harness).second) throw std::logic_error(std::string("harness ") + name + " twice");
  }
};

}  // namespace ddp::fuzz
