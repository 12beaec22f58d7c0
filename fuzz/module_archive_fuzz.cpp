// Fuzzes read_archive (src/train/module_archive.cpp): the bytes are a
// LibTorch archive (an optimizer's torch::save, a TorchScript module), read
// as data only and loaded into the SGD optimizer of a small model. A
// malformed file must be a ddp::CheckpointError (an archive of plain data
// that does not fit the optimizer: LibTorch's c10::Error); code from the
// input must never run (code_sentinel.h). Run: fuzz/README.md.
#include <torch/torch.h>

#include "code_sentinel.h"
#include "ddp/train/state_dict.h"
#include "fuzz_input.h"
#include "harnesses.h"

namespace {

int fuzz_module_archive(const uint8_t* data, size_t size) {
  ddp::fuzz::MemFile file(data, size);
  try {
    auto archive = ddp::read_archive(file.path());
    torch::nn::Linear model(2, 3);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    try {
      optimizer.load(archive);
    } catch (const c10::Error&) {
    }
  } catch (const ddp::CheckpointError&) {
  }
  ddp::fuzz::abort_if_code_ran();
  return 0;
}

const ddp::fuzz::AddHarness kModuleArchiveHarness{"module_archive_fuzz", fuzz_module_archive};

}  // namespace
