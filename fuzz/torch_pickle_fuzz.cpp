// Fuzzes the torch.save reader (src/train/torch_pickle.cpp) from bytes: a
// zip archive with data.pkl and the tensors' storages, as Python's
// torch.save and LibTorch's torch::pickle_save write. A malformed file must
// be a ddp::CheckpointError; anything else is a finding. Run: fuzz/README.md.
#include "fuzz_input.h"
#include "torch_pickle.h"
#include "harnesses.h"

namespace {

int fuzz_torch_pickle(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(data, data + size);
  try {
    (void)ddp::pickle::load(bytes, "fuzz input");
  } catch (const ddp::CheckpointError&) {
  }
  return 0;
}

const ddp::fuzz::AddHarness kTorchPickleHarness{"torch_pickle_fuzz", fuzz_torch_pickle};

}  // namespace
