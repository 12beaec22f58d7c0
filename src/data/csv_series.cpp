#include "ddp/data/csv_series.h"

#include "runtime/regular_file.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

namespace ddp {

namespace {

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  for (auto& f : out) {
    const auto b = f.find_first_not_of(" \t"), e = f.find_last_not_of(" \t");
    f = b == std::string::npos ? "" : f.substr(b, e - b + 1);
  }
  return out;
}

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && errno == 0 && std::isfinite(out);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

CsvSeries read_csv_series(const std::string& path) {
  if (const auto why = why_not_a_regular_file(path); !why.empty())
    throw DataError(path + ": cannot open (" + why + "); pass the CSV's path (the example's generator writes one)");
  std::ifstream in(path);
  if (!in) throw DataError(path + ": cannot open; pass the CSV's path (the example's generator writes one)");
  std::string line;
  size_t line_no = 0;
  std::vector<std::string> header;
  while (header.empty() && std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") != std::string::npos) header = split_fields(line);
  }
  if (header.empty()) throw DataError(path + ": empty file; expected a header row and data rows");
  CsvSeries out;
  std::vector<float> values;
  size_t first = 0;  // index of the first numeric column
  bool decided = false;
  const std::string h0 = lower(header[0]);
  if (h0 == "date" || h0 == "time" || h0 == "timestamp" || h0 == "datetime") {
    first = 1;
    decided = true;
  }
  size_t rows = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto fields = split_fields(line);
    if (fields.size() != header.size())
      throw DataError(path + ":" + std::to_string(line_no) + ": " + std::to_string(fields.size()) + " fields, the header has " +
                      std::to_string(header.size()));
    double v;
    if (!decided) {
      first = parse_number(fields[0], v) ? 0 : 1;
      decided = true;
    }
    if (first == 1) out.times.push_back(fields[0]);
    for (size_t c = first; c < fields.size(); ++c) {
      if (!parse_number(fields[c], v))
        throw DataError(path + ":" + std::to_string(line_no) + ": column '" + header[c] + "' holds '" + fields[c] +
                        "', not a number");
      // The values are float32: a double past its range would not convert (undefined behaviour, in practice inf).
      if (std::fabs(v) > std::numeric_limits<float>::max())
        throw DataError(path + ":" + std::to_string(line_no) + ": column '" + header[c] + "' holds '" + fields[c] +
                        "', outside float32's range");
      values.push_back(static_cast<float>(v));
    }
    ++rows;
  }
  if (rows == 0) throw DataError(path + ": a header but no data rows");
  if (first >= header.size()) throw DataError(path + ": no numeric columns");
  out.columns.assign(header.begin() + static_cast<std::ptrdiff_t>(first), header.end());
  if (first == 1) out.time_column = header[0];
  out.values = torch::from_blob(values.data(), {static_cast<int64_t>(rows), static_cast<int64_t>(out.columns.size())},
                                torch::kFloat)
                   .clone();
  return out;
}

Normalizer Normalizer::fit(const torch::Tensor& values) {
  Normalizer n;
  n.mean = values.mean(0);
  // A constant column would divide by zero: leave it unscaled.
  n.std = values.std(0, /*unbiased=*/false).clamp_min(1e-8);
  return n;
}

torch::Tensor Normalizer::apply(const torch::Tensor& values) const { return (values - mean) / std; }
torch::Tensor Normalizer::invert(const torch::Tensor& values) const { return values * std + mean; }

SlidingWindows::SlidingWindows(torch::Tensor series, int64_t input_len, int64_t horizon)
    : series_(std::move(series)), input_len_(input_len), horizon_(horizon) {
  if (series_.dim() != 2 || input_len < 1 || horizon < 1)
    throw UsageError("SlidingWindows: need a [rows, columns] series and positive lengths");
  if (series_.size(0) < input_len + horizon)
    throw DataError("SlidingWindows: " + std::to_string(series_.size(0)) + " rows are fewer than input " +
                    std::to_string(input_len) + " + horizon " + std::to_string(horizon));
}

torch::data::Example<> SlidingWindows::get_batch(std::vector<size_t> indices) {
  std::vector<torch::Tensor> xs, ys;
  xs.reserve(indices.size());
  ys.reserve(indices.size());
  for (size_t i : indices) {
    const auto start = static_cast<int64_t>(i);
    xs.push_back(series_.narrow(0, start, input_len_));
    ys.push_back(series_.narrow(0, start + input_len_, horizon_));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

c10::optional<size_t> SlidingWindows::size() const {
  return static_cast<size_t>(series_.size(0) - input_len_ - horizon_ + 1);
}

}  // namespace ddp
