// Writes the fuzz seeds only libddp makes: a training checkpoint
// (save_checkpoint) and a state dict (save_state_dict) of the Linear(2, 3)
// and SGD the harnesses load into, into fuzz/corpus/<harness>/ddp-*.pt.
// Built with DDP_FUZZ as fuzz_make_seeds; run: build-san/fuzz/fuzz_make_seeds fuzz/corpus
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
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
  // A sharded checkpoint of the same state, with Adam, as sharded_checkpoint_fuzz cuts its input.
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.1));
  adam.step();
  ddp::save_sharded_checkpoint((tmp / "sharded").string(), *model, adam, state, pg);
  std::string id;
  for (const auto& e : fs::directory_iterator(tmp / "sharded"))
    if (e.path().filename().string().rfind("save-", 0) == 0) id = e.path().filename().string();
  auto bytes = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto length = [](const std::string& s, int width) {
    std::string out;
    for (int i = 0; i < width; ++i) out += static_cast<char>((s.size() >> (8 * i)) & 0xff);
    return out + s;
  };
  const std::string manifest = bytes(tmp / "sharded" / "manifest.pt"), index = bytes(tmp / "sharded" / id / "rank0.pt");
  fs::create_directories(corpus / "sharded_checkpoint_fuzz");
  std::ofstream(corpus / "sharded_checkpoint_fuzz" / "ddp-sharded.bin", std::ios::binary)
      << length(id, 2) << length(manifest, 4) << length(index, 4) << bytes(tmp / "sharded" / id / "rank0.bin");
  fs::remove_all(tmp);
  std::cout << "ok\n";
  return 0;
}
