#include "ddp/data/fashion_mnist.h"

#include "runtime/regular_file.h"

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>

namespace ddp {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
// Far above Fashion-MNIST's 60000 x 28 x 28: a corrupt header cannot make us allocate gigabytes.
constexpr uint64_t kMaxBytes = uint64_t(1) << 30;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

class IdxFile {
 public:
  explicit IdxFile(std::string path) : path_(std::move(path)) {
    // gzopen would block on a FIFO and read /dev/zero for ever.
    if (const auto why = why_not_a_regular_file(path_, &file_size_); !why.empty()) throw DataError(path_ + ": " + why);
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) throw DataError(path_ + ": cannot open");
  }

  // A header may not declare more bytes than the file could hold: memory
  // follows what is there, not what a corrupt header says.
  void check_declared(uint64_t bytes, const char* what) {
    const uint64_t ratio = gzdirect(file_.get()) ? 1 : 1032;  // deflate's best ratio
    if (bytes > file_size_ * ratio)
      throw DataError(path_ + ": its header declares " + std::to_string(bytes) + " bytes of " + what + " but the " +
                      std::to_string(file_size_) + "-byte file cannot hold them; truncated or corrupt");
  }

  void read(void* out, uint64_t bytes, const char* what) {
    auto* p = static_cast<char*>(out);
    while (bytes > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(bytes, 1u << 30));
      const int n = gzread(file_.get(), p, chunk);
      if (n < 0) {
        int err = 0;
        const char* msg = gzerror(file_.get(), &err);
        throw DataError(path_ + ": corrupt (" + msg + ") while reading " + what +
                        "; download it again or reinstall dataset-fashion-mnist");
      }
      if (n == 0)
        throw DataError(path_ + ": truncated while reading " + what +
                        "; download it again or reinstall dataset-fashion-mnist");
      p += n;
      bytes -= static_cast<uint64_t>(n);
    }
  }

  uint32_t read_be32(const char* what) {
    unsigned char b[4];
    read(b, 4, what);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
  }

  void expect_end() {
    char extra;
    const int n = gzread(file_.get(), &extra, 1);
    if (n != 0) throw DataError(path_ + ": " + (n < 0 ? "corrupt" : "longer than its header says") + "; not an idx file?");
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

std::string magic_error(const std::string& path, uint32_t got, uint32_t want) {
  char buf[96];
  std::snprintf(buf, sizeof buf, ": bad magic number 0x%08x (expected 0x%08x)", got, want);
  return path + buf + "; not an idx file of this kind, or corrupt";
}

// `name` with or without .gz in `dir`.
std::string find_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  for (const auto& candidate : {fs::path(dir) / (name + ".gz"), fs::path(dir) / name})
    if (fs::exists(candidate)) return candidate.string();
  throw DataError("Fashion-MNIST: " + (fs::path(dir) / (name + ".gz")).string() +
                  " not found. Install Debian's package (apt-get install dataset-fashion-mnist) or pass "
                  "--data-dir DIR with " + name + "(.gz) in it");
}

}  // namespace

std::string default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

torch::Tensor read_idx_images(const std::string& path) {
  IdxFile f(path);
  const uint32_t magic = f.read_be32("the magic number");
  if (magic != kImagesMagic) throw DataError(magic_error(path, magic, kImagesMagic));
  const uint64_t n = f.read_be32("the image count"), rows = f.read_be32("the row count"),
                 cols = f.read_be32("the column count");
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 || n * rows * cols > kMaxBytes)
    throw DataError(path + ": implausible dimensions " + std::to_string(n) + "x" + std::to_string(rows) + "x" +
                    std::to_string(cols) + "; corrupt file");
  f.check_declared(n * rows * cols, "pixels");
  auto images = torch::empty({static_cast<int64_t>(n), static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
                             torch::kUInt8);
  f.read(images.data_ptr(), n * rows * cols, "the pixels");
  f.expect_end();
  return images;
}

torch::Tensor read_idx_labels(const std::string& path) {
  IdxFile f(path);
  const uint32_t magic = f.read_be32("the magic number");
  if (magic != kLabelsMagic) throw DataError(magic_error(path, magic, kLabelsMagic));
  const uint64_t n = f.read_be32("the label count");
  if (n > kMaxBytes) throw DataError(path + ": implausible label count " + std::to_string(n) + "; corrupt file");
  f.check_declared(n, "labels");
  auto labels = torch::empty({static_cast<int64_t>(n)}, torch::kUInt8);
  f.read(labels.data_ptr(), n, "the labels");
  f.expect_end();
  return labels;
}

FashionMNIST read_fashion_mnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  auto images = read_idx_images(images_path);
  auto labels = read_idx_labels(labels_path);
  if (images.size(0) != labels.size(0))
    throw DataError("Fashion-MNIST: " + images_path + " holds " + std::to_string(images.size(0)) + " images but " +
                    labels_path + " " + std::to_string(labels.size(0)) + " labels");
  if (images.size(1) != 28 || images.size(2) != 28)
    throw DataError(images_path + ": images are " + std::to_string(images.size(1)) + "x" +
                    std::to_string(images.size(2)) + ", Fashion-MNIST's are 28x28");
  if (labels.numel() > 0 && labels.max().item<int>() > 9)
    throw DataError(labels_path + ": label " + std::to_string(labels.max().item<int>()) +
                    " out of range 0..9; corrupt file");
  return {images.unsqueeze(1).to(torch::kFloat).div_(255.0), labels.to(torch::kLong)};
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace ddp
