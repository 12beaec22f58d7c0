// Fashion-MNIST from the idx files of Debian's dataset-fashion-mnist package
// (/usr/share/datasets/fashion-mnist/*-ubyte.gz), read directly through zlib.
// Magic numbers, dimensions and sizes are checked: a corrupt or truncated
// file is a ddp::DataError naming the file, never a crash.
//
//   auto train = ddp::read_fashion_mnist(dir, ddp::Split::Train);
//   train.images;  // [60000, 1, 28, 28] float in [0, 1]
//   train.labels;  // [60000] int64 in [0, 9]
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/errors.h"

namespace ddp {

enum class Split { Train, Test };

struct FashionMNIST {
  torch::Tensor images;  // [N, 1, 28, 28] float32, pixel / 255
  torch::Tensor labels;  // [N] int64
};

// Where Debian's dataset-fashion-mnist puts the files.
std::string default_fashion_mnist_dir();

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte(.gz) from `dir`; a
// missing file is a DataError that names the package to install and --data-dir.
FashionMNIST read_fashion_mnist(const std::string& dir, Split split);

// The idx readers underneath; gzip-compressed or plain files alike.
// Images: magic 0x00000803, [N, rows, cols] uint8. Labels: magic 0x00000801, [N] uint8.
torch::Tensor read_idx_images(const std::string& path);
torch::Tensor read_idx_labels(const std::string& path);

// "T-shirt/top", "Trouser", ... in label order.
const std::vector<std::string>& fashion_mnist_classes();

}  // namespace ddp
