// Writes the fuzz seeds only libddp makes: a training checkpoint
// (save_checkpoint) and a state dict (save_state_dict) of the Linear(2, 3)
// and SGD the harnesses load into, into fuzz/corpus/<harness>/ddp-*.pt.
// Built with DDP_FUZZ as fuzz_make_seeds; run: build-san/fuzz/fuzz_make_seeds fuzz/corpus
#include <torch/torch.h>

#include <filesystem>
#include <iostream>

#include "ddp/train/checkpoint.h"
#include "ddp/train/state_dict.h"
#include "../../tests/support/fake_process_group.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds CORPUS_DIR\n";
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path corpus = argv[1];
  torch::manual_seed(0);
  torch::nn::Linear model(2, 3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model->forward(torch::ones({1, 2})).sum().backward();
  optimizer.step();
  ddp::testing::FakeGroup pg;
  ddp::TrainState state;
  state.epoch = 2;
  state.step = 10;
  state.config["lr"] = "0.1";
  const fs::path tmp = fs::temp_directory_path() / "ddp-fuzz-seeds";
  fs::create_directories(tmp);
  ddp::save_checkpoint((tmp / "checkpoint.pt").string(), *model, optimizer, state, pg);
  ddp::save_state_dict(*model, (tmp / "state_dict.pt").string());
  for (const char* harness : {"torch_pickle_fuzz", "state_dict_fuzz", "checkpoint_fuzz"}) {
    fs::create_directories(corpus / harness);
    fs::copy_file(tmp / "checkpoint.pt", corpus / harness / "ddp-checkpoint.pt", fs::copy_options::overwrite_existing);
    fs::copy_file(tmp / "state_dict.pt", corpus / harness / "ddp-state-dict.pt", fs::copy_options::overwrite_existing);
  }
  fs::remove_all(tmp);
  std::cout << "ok\n";
  return 0;
}
