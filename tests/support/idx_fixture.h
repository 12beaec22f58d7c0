// Small Fashion-MNIST-shaped idx files for tests: written with zlib, so the
// reader's real path is exercised without the 30 MB data set.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ddp::testing {

inline std::vector<unsigned char> be32(uint32_t v) {
  return {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16), static_cast<unsigned char>(v >> 8),
          static_cast<unsigned char>(v)};
}

// Writes `bytes` gzip-compressed (or plain) to `path`.
inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes, bool gzip = true) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

inline std::vector<unsigned char> idx_images(uint32_t n, uint32_t rows = 28, uint32_t cols = 28, uint32_t magic = 0x803) {
  std::vector<unsigned char> b;
  for (uint32_t v : {magic, n, rows, cols}) {
    auto x = be32(v);
    b.insert(b.end(), x.begin(), x.end());
  }
  // Image i: its label's stripe brightened, so a model can learn something.
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t p = 0; p < rows * cols; ++p)
      b.push_back(static_cast<unsigned char>((p / cols) % 10 == i % 10 ? 200 : (i * 7 + p * 13) % 50));
  return b;
}

inline std::vector<unsigned char> idx_labels(uint32_t n, uint32_t magic = 0x801) {
  std::vector<unsigned char> b;
  for (uint32_t v : {magic, n}) {
    auto x = be32(v);
    b.insert(b.end(), x.begin(), x.end());
  }
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<unsigned char>(i % 10));
  return b;
}

// A complete small data set in `dir`: n_train and n_test samples.
inline void write_fashion_mnist(const std::string& dir, uint32_t n_train, uint32_t n_test) {
  std::filesystem::create_directories(dir);
  write_bytes(dir + "/train-images-idx3-ubyte.gz", idx_images(n_train));
  write_bytes(dir + "/train-labels-idx1-ubyte.gz", idx_labels(n_train));
  write_bytes(dir + "/t10k-images-idx3-ubyte.gz", idx_images(n_test));
  write_bytes(dir + "/t10k-labels-idx1-ubyte.gz", idx_labels(n_test));
}

inline std::string temp_dir(const std::string& name) {
  std::string t = (std::filesystem::temp_directory_path() / ("ddp_" + name + "_XXXXXX")).string();
  return ::mkdtemp(t.data());
}

}  // namespace ddp::testing
