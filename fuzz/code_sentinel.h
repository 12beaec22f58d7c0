// The file a seed's TorchScript payload creates if a reader ever runs code
// from an archive (fuzz/corpus/*/code-*.pt, made by
// tests/train/python_code_archives.py with this path as its victim). A
// harness aborts when it appears: running code from a file is a finding,
// however the fuzzer mutates the archive around the payload.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace ddp::fuzz {

constexpr const char* kCodeSentinel = "/tmp/ddp-fuzz-code-ran";

inline void abort_if_code_ran() {
  if (::access(kCodeSentinel, F_OK) == 0) {
    std::fprintf(stderr, "finding: %s exists: a reader ran code from the input\n", kCodeSentinel);
    std::abort();
  }
}

}  // namespace ddp::fuzz
