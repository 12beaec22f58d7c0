// Fuzzes load_checkpoint of a sharded checkpoint's folder
// (src/train/sharded_load.cpp): the bytes are the folder's three files, cut
// as [u16 n][the save's id, n bytes][u32 n][manifest.pt][u32 n][rank0.pt]
// [the rest: rank0.bin], written to a folder in /dev/shm (memory, removed
// after each input), restored into a small model and its Adam optimizer on a
// one-rank group. A malformed checkpoint must be a ddp::CheckpointError;
// anything else is a finding, and so is running code from the input
// (code_sentinel.h). Run: fuzz/README.md.
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "code_sentinel.h"
#include "ddp/train/checkpoint.h"
#include "../tests/support/fake_process_group.h"
#include "harnesses.h"

namespace {

// The next n-byte length (little-endian) and that many bytes; false past the end.
bool take(const uint8_t*& p, const uint8_t* end, int width, std::string& out) {
  if (end - p < width) return false;
  size_t n = 0;
  for (int i = width - 1; i >= 0; --i) n = (n << 8) | p[i];
  p += width;
  n = std::min(n, static_cast<size_t>(end - p));
  out.assign(reinterpret_cast<const char*>(p), n);
  p += n;
  return true;
}

void write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int fuzz_sharded_checkpoint(const uint8_t* data, size_t size) {
  const uint8_t *p = data, *end = data + size;
  std::string id, manifest, index;
  if (!take(p, end, 2, id) || !take(p, end, 4, manifest) || !take(p, end, 4, index)) return 0;
  // The harness's own writes stay in its folder: an id that is no plain name is replaced.
  const bool plain = !id.empty() && id.size() <= 64 && id != "." && id != ".." &&
                     std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; });
  namespace fs = std::filesystem;
  const fs::path dir = "/dev/shm/ddp-fuzz-sharded-" + std::to_string(::getpid());
  const fs::path save = dir / (plain ? id : std::string("save-0"));
  fs::remove_all(dir);
  fs::create_directories(save);
  write(dir / "manifest.pt", manifest);
  write(save / "rank0.pt", index);
  write(save / "rank0.bin", std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(end - p)));
  ddp::testing::FakeGroup pg;
  torch::nn::Linear model(2, 3);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.1));
  try {
    (void)ddp::load_checkpoint(dir.string(), *model, &optimizer, pg);
  } catch (const ddp::CheckpointError&) {
  }
  fs::remove_all(dir);
  ddp::fuzz::abort_if_code_ran();
  return 0;
}

const ddp::fuzz::AddHarness kShardedCheckpointHarness{"sharded_checkpoint_fuzz", fuzz_sharded_checkpoint};

}  // namespace
