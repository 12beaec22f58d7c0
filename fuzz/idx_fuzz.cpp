// Fuzzes the idx readers (src/data/fashion_mnist.cpp): the bytes are an idx
// file, plain or gzip-compressed, read as images and as labels. A malformed
// file must be a ddp::DataError; anything else (a crash, a sanitizer report,
// another exception) is a finding. Run: fuzz/README.md.
#include "ddp/data/fashion_mnist.h"
#include "fuzz_input.h"
#include "harnesses.h"

namespace {

int fuzz_idx(const uint8_t* data, size_t size) {
  ddp::fuzz::MemFile file(data, size);
  try {
    (void)ddp::read_idx_images(file.path());
  } catch (const ddp::DataError&) {
  }
  try {
    (void)ddp::read_idx_labels(file.path());
  } catch (const ddp::DataError&) {
  }
  return 0;
}

const ddp::fuzz::AddHarness kIdxHarness{"idx_fuzz", fuzz_idx};

}  // namespace
