// The CSV series reader, normalisation and sliding windows.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../support/idx_fixture.h"
#include "ddp/data/csv_series.h"

namespace {

std::string write(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/series.csv";
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& path) {
  try {
    ddp::read_csv_series(path);
  } catch (const ddp::DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CsvSeries, HeaderTimeColumnAndValues) {
  const auto dir = ddp::testing::temp_dir("csv");
  auto s = ddp::read_csv_series(write(dir, "date,a,b\n2020-01-01 00:00:00,1,2.5\n\n2020-01-01 01:00:00,3,-4e-1\r\n"));
  EXPECT_EQ(s.time_column, "date");
  EXPECT_EQ(s.columns, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.times.size(), 2u);
  EXPECT_TRUE(torch::allclose(s.values, torch::tensor({{1.0f, 2.5f}, {3.0f, -0.4f}})));
  auto no_time = ddp::read_csv_series(write(dir, "x,y\n1,2\n3,4\n"));
  EXPECT_EQ(no_time.time_column, "");
  EXPECT_EQ(no_time.values.size(1), 2);
  std::filesystem::remove_all(dir);
}

TEST(CsvSeries, BadRowsNameTheirLine) {
  const auto dir = ddp::testing::temp_dir("csv_bad");
  auto msg = error_of(write(dir, "date,a,b\nt0,1,2\nt1,1,oops\n"));
  EXPECT_NE(msg.find("series.csv:3: column 'b' holds 'oops', not a number"), std::string::npos) << msg;
  msg = error_of(write(dir, "date,a,b\nt0,1,2\n\nt1,1\n"));
  EXPECT_NE(msg.find("series.csv:4: 2 fields, the header has 3"), std::string::npos) << msg;
  EXPECT_NE(error_of(write(dir, "")).find("empty file"), std::string::npos);
  EXPECT_NE(error_of(write(dir, "a,b\n")).find("no data rows"), std::string::npos);
  EXPECT_NE(error_of(dir + "/none.csv").find("cannot open"), std::string::npos);
  // A finite double past float32 was converted anyway: undefined behaviour that UBSan stops at
  // (regression input fuzz/corpus/csv_series_fuzz/crash-float-overflow).
  msg = error_of(write(dir, "a,b\n1,2\n3,-1e300\n"));
  EXPECT_NE(msg.find("series.csv:3: column 'b' holds '-1e300', outside float32's range"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(CsvSeries, NormaliserFitsTheTrainingRowsOnly) {
  auto values = torch::tensor({{1.0f}, {3.0f}, {100.0f}});
  auto norm = ddp::Normalizer::fit(values.narrow(0, 0, 2));
  EXPECT_FLOAT_EQ(norm.mean.item<float>(), 2.0f);
  EXPECT_FLOAT_EQ(norm.std.item<float>(), 1.0f);
  EXPECT_TRUE(torch::allclose(norm.invert(norm.apply(values)), values));
}

TEST(CsvSeries, SlidingWindowsCutInputAndHorizon) {
  auto series = torch::arange(20, torch::kFloat).view({10, 2});
  ddp::SlidingWindows w(series, 3, 2);
  EXPECT_EQ(w.size().value(), 6u);
  auto b = w.get_batch({0, 5});
  EXPECT_EQ(b.data.sizes(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(b.data[1][0][0].item<float>(), 10.0f);
  EXPECT_EQ(b.target[1][1][1].item<float>(), 19.0f);
  EXPECT_THROW(ddp::SlidingWindows(series, 9, 2), ddp::DataError);
}
