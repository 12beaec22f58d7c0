// The idx reader: real files when Debian's package is installed, and small
// written ones for every way a file can be wrong.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/idx_fixture.h"
#include "ddp/data/fashion_mnist.h"

using namespace ddp::testing;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddp::DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(FashionMNIST, ReadsDebiansPackageWhenInstalled) {
  const auto dir = ddp::default_fashion_mnist_dir();
  if (!std::filesystem::exists(dir + "/t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto test = ddp::read_fashion_mnist(dir, ddp::Split::Test);
  EXPECT_EQ(test.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(test.labels.sizes(), (std::vector<int64_t>{10000}));
  EXPECT_EQ(test.images.scalar_type(), torch::kFloat);
  EXPECT_GE(test.images.min().item<float>(), 0.f);
  EXPECT_LE(test.images.max().item<float>(), 1.f);
  EXPECT_EQ(torch::bincount(test.labels).min().item<int64_t>(), 1000);  // balanced classes
  auto train = ddp::read_fashion_mnist(dir, ddp::Split::Train);
  EXPECT_EQ(train.images.size(0), 60000);
}

TEST(FashionMNIST, ReadsGzipAndPlainFiles) {
  const auto dir = temp_dir("fmnist");
  write_fashion_mnist(dir, 30, 20);
  auto train = ddp::read_fashion_mnist(dir, ddp::Split::Train);
  EXPECT_EQ(train.images.sizes(), (std::vector<int64_t>{30, 1, 28, 28}));
  EXPECT_EQ(train.labels[13].item<int64_t>(), 3);
  EXPECT_FLOAT_EQ(train.images[3][0][3][0].item<float>(), 200.f / 255.f);
  // Uncompressed files, as torchvision's raw folder holds them.
  std::filesystem::remove(dir + "/t10k-labels-idx1-ubyte.gz");
  write_bytes(dir + "/t10k-labels-idx1-ubyte", idx_labels(20), /*gzip=*/false);
  EXPECT_EQ(ddp::read_fashion_mnist(dir, ddp::Split::Test).labels.size(0), 20);
  std::filesystem::remove_all(dir);
}

TEST(FashionMNIST, MissingFileNamesThePackageAndDataDir) {
  const auto msg = error_of([] { ddp::read_fashion_mnist("/nonexistent/dir", ddp::Split::Train); });
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data-dir"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/nonexistent/dir/train-images-idx3-ubyte.gz"), std::string::npos) << msg;
}

TEST(FashionMNIST, CorruptFilesAreErrorsNotCrashes) {
  const auto dir = temp_dir("fmnist_bad");
  const std::string f = dir + "/file.gz";
  auto expect_error = [&](const std::vector<unsigned char>& bytes, bool images, const std::string& needle) {
    write_bytes(f, bytes);
    auto msg = error_of([&] { images ? ddp::read_idx_images(f) : ddp::read_idx_labels(f); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "got: " << msg;
    EXPECT_NE(msg.find(f), std::string::npos) << "the message names the file: " << msg;
  };
  expect_error(idx_images(5, 28, 28, 0x801), true, "bad magic number 0x00000801 (expected 0x00000803)");
  expect_error(idx_labels(5, 0x803), false, "bad magic number");
  auto truncated = idx_images(5);
  truncated.resize(truncated.size() - 100);
  expect_error(truncated, true, "truncated");
  auto longer = idx_labels(5);
  longer.push_back(0);
  expect_error(longer, false, "longer than its header says");
  expect_error({0, 0, 8}, true, "truncated");
  std::vector<unsigned char> huge;  // a header claiming 268 million images
  for (uint32_t v : {0x803u, 0xFFFFFFFu, 28u, 28u}) {
    auto b = be32(v);
    huge.insert(huge.end(), b.begin(), b.end());
  }
  expect_error(huge, true, "implausible dimensions");
  // Not gzip at all and not idx either: zlib reads it as plain bytes, the magic check catches it.
  write_bytes(f, {'h', 'e', 'l', 'l', 'o', '!', '!', '!'}, false);
  EXPECT_NE(error_of([&] { ddp::read_idx_labels(f); }).find("bad magic"), std::string::npos);
  // A gzip stream cut in the middle.
  write_bytes(f, idx_images(50));
  const auto size = std::filesystem::file_size(f);
  std::filesystem::resize_file(f, size / 2);
  EXPECT_FALSE(error_of([&] { ddp::read_idx_images(f); }).empty());
  // Counts that disagree between images and labels.
  write_fashion_mnist(dir, 10, 10);
  write_bytes(dir + "/train-labels-idx1-ubyte.gz", idx_labels(9));
  EXPECT_NE(error_of([&] { ddp::read_fashion_mnist(dir, ddp::Split::Train); }).find("9 labels"), std::string::npos);
  std::filesystem::remove_all(dir);
}
