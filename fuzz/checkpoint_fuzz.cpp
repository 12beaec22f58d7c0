// Fuzzes load_checkpoint (src/train/checkpoint.cpp): the bytes are a
// training checkpoint, restored into a small model and its SGD optimizer on a
// one-rank group. A malformed checkpoint must be a ddp::CheckpointError;
// anything else is a finding, and so is running code from the input
// (code_sentinel.h). Run: fuzz/README.md.
#include <torch/torch.h>

#include "code_sentinel.h"
#include "ddp/train/checkpoint.h"
#include "fuzz_input.h"
#include "../tests/support/fake_process_group.h"
#include "harnesses.h"

namespace {

int fuzz_checkpoint(const uint8_t* data, size_t size) {
  ddp::fuzz::MemFile file(data, size);
  ddp::testing::FakeGroup pg;
  torch::nn::Linear model(2, 3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  try {
    (void)ddp::load_checkpoint(file.path(), *model, &optimizer, pg);
  } catch (const ddp::CheckpointError&) {
  }
  ddp::fuzz::abort_if_code_ran();
  return 0;
}

const ddp::fuzz::AddHarness kCheckpointHarness{"checkpoint_fuzz", fuzz_checkpoint};

}  // namespace
