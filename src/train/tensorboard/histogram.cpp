#include "train/tensorboard/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace ddp::tensorboard {

const std::vector<double>& default_bucket_edges() {
  static const std::vector<double> edges = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) positive.push_back(v);
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return edges;
}

namespace {

// numpy.histogram's counts for explicit edges.
std::vector<double> bucket_counts(const std::vector<double>& values, const std::vector<double>& edges) {
  std::vector<double> counts(edges.size() - 1, 0.0);
  for (double v : values) {
    if (!(v >= edges.front() && v <= edges.back())) continue;
    auto i = static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin());
    counts[std::min(i, counts.size()) - 1] += 1;  // v == the last edge: the last bucket
  }
  return counts;
}

}  // namespace

HistogramResult make_histogram(const std::vector<double>& values, const std::vector<double>& edges) {
  HistogramResult r;
  if (values.empty()) {
    r.what = "it has no values";
    return r;
  }
  Histogram& h = r.histogram;
  h.min = h.max = values.front();
  for (double v : values) {
    if (!std::isfinite(v)) {
      r.what = "it holds a value that is not finite (" + std::to_string(v) + ")";
      return r;
    }
    h.min = std::min(h.min, v);
    h.max = std::max(h.max, v);
    h.sum += v;
    h.sum_squares += v * v;
  }
  h.num = static_cast<double>(values.size());
  const auto counts = bucket_counts(values, edges);
  // The first and the last bucket that hold a value (PyTorch finds them with
  // a cumulative sum and searchsorted; the same buckets).
  size_t first = counts.size(), last = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) {
      first = std::min(first, i);
      last = i;
    }
  if (first == counts.size()) {
    r.what = "no value lies within the buckets' edges [" + std::to_string(edges.front()) + ", " +
             std::to_string(edges.back()) + "]";
    return r;
  }
  // TensorBoard keeps right edges only: one empty bucket to the left keeps
  // the first kept bucket's left edge.
  if (first == 0) h.bucket.push_back(0.0);
  for (size_t i = first == 0 ? 0 : first - 1; i <= last; ++i) h.bucket.push_back(counts[i]);
  h.bucket_limit.assign(edges.begin() + static_cast<std::ptrdiff_t>(first),
                        edges.begin() + static_cast<std::ptrdiff_t>(last) + 2);
  return r;
}

}  // namespace ddp::tensorboard
