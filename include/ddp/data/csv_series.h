// Multivariate time series from CSV, for forecasting (the Informer example):
// a header row, an optional time column, one numeric column per variable.
// Normalisation is fitted on the training split only; sliding windows cut
// (input, horizon) pairs out of a series. A malformed row is a DataError
// naming the file and line.
//
//   auto csv = ddp::read_csv_series("datatry.csv");            // values: [T, C]
//   auto norm = ddp::Normalizer::fit(csv.values.narrow(0, 0, train_rows));
//   ddp::SlidingWindows train(norm.apply(csv.values.narrow(0, 0, train_rows)), 96, 24);
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/errors.h"

namespace ddp {

struct CsvSeries {
  std::vector<std::string> columns;  // the numeric columns' names
  std::string time_column;           // "" when there is none
  std::vector<std::string> times;    // the time column's values, one a row
  torch::Tensor values;              // [rows, columns] float32
};

// The first column is the time column when its header is date/time/
// timestamp (any case) or its first value is not a number. Every other
// field must be a finite number; empty lines are skipped.
CsvSeries read_csv_series(const std::string& path);

// Per-column standardisation.
struct Normalizer {
  torch::Tensor mean, std;  // [columns]
  // Mean and standard deviation over the rows given (the training split).
  static Normalizer fit(const torch::Tensor& values);
  torch::Tensor apply(const torch::Tensor& values) const;
  torch::Tensor invert(const torch::Tensor& values) const;
};

// Window i: data = series[i, i + input_len), target = series[i + input_len,
// i + input_len + horizon). size() = rows - input_len - horizon + 1.
class SlidingWindows
    : public torch::data::datasets::BatchDataset<SlidingWindows, torch::data::Example<>, std::vector<size_t>> {
 public:
  SlidingWindows(torch::Tensor series, int64_t input_len, int64_t horizon);
  torch::data::Example<> get_batch(std::vector<size_t> indices) override;
  c10::optional<size_t> size() const override;

 private:
  torch::Tensor series_;
  int64_t input_len_, horizon_;
};

}  // namespace ddp
