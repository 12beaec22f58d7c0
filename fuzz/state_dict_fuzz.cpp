// Fuzzes read_state_dict (src/train/state_dict.cpp): the bytes are a state
// dict file as torch.save(model.state_dict()) or ddp::save_state_dict write,
// then loaded into a small model. A malformed file or a mismatch must be a
// ddp::CheckpointError; anything else is a finding, and so is running code
// from the input (code_sentinel.h). Run: fuzz/README.md.
#include <torch/torch.h>

#include "code_sentinel.h"
#include "ddp/train/state_dict.h"
#include "fuzz_input.h"
#include "harnesses.h"

namespace {

int fuzz_state_dict(const uint8_t* data, size_t size) {
  ddp::fuzz::MemFile file(data, size);
  try {
    ddp::StateDict state = ddp::read_state_dict(file.path());
    torch::nn::Linear model(2, 3);
    ddp::load_state_dict(*model, ddp::strip_module_prefix(state), /*strict=*/false);
  } catch (const ddp::CheckpointError&) {
  }
  ddp::fuzz::abort_if_code_ran();
  return 0;
}

const ddp::fuzz::AddHarness kStateDictHarness{"state_dict_fuzz", fuzz_state_dict};

}  // namespace
