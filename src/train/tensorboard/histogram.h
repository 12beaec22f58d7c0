// A histogram as PyTorch's SummaryWriter.add_histogram makes it by default
// (bins='tensorflow'; torch/utils/tensorboard/summary.py, make_histogram):
// numpy's histogram over TensorFlow's fixed bucket edges, then trimmed to the
// buckets that hold values, with one empty bucket before them whose right
// edge is the first kept one's left. A pure function, so it has its own test.
#pragma once

#include <string>
#include <vector>

namespace ddp::tensorboard {

// The edges: -1e20 < ... < -1e-12, 0, 1e-12 < 1e-12 * 1.1 < ... < 1e20
// (each 1.1 times the one before, in double arithmetic as Python's).
const std::vector<double>& default_bucket_edges();

struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit;  // each kept bucket's right edge
  std::vector<double> bucket;        // its count
};

// The values' histogram over `edges` (increasing). A value v falls in
// bucket i when edges[i] <= v < edges[i+1] (the last bucket includes its
// right edge); a value outside [edges.front(), edges.back()] counts in num,
// min, max and the sums, in no bucket. Returns an empty `what` on success,
// else why there is none: no values, a value that is not finite, or no value
// inside the edges (PyTorch raises ValueError for the first and the last).
struct HistogramResult {
  Histogram histogram;
  std::string what;
};
HistogramResult make_histogram(const std::vector<double>& values, const std::vector<double>& edges);

}  // namespace ddp::tensorboard
