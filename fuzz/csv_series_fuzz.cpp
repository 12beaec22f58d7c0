// Fuzzes the CSV series reader (src/data/csv_series.cpp): the bytes are the
// CSV file. A malformed one must be a ddp::DataError; anything else is a
// finding. Normalizer and SlidingWindows are fed what it returns, as the
// Informer example does. Run: fuzz/README.md.
#include "ddp/data/csv_series.h"
#include "fuzz_input.h"
#include "harnesses.h"

namespace {

int fuzz_csv_series(const uint8_t* data, size_t size) {
  ddp::fuzz::MemFile file(data, size);
  try {
    ddp::CsvSeries csv = ddp::read_csv_series(file.path());
    if (csv.values.size(0) >= 2) {
      auto norm = ddp::Normalizer::fit(csv.values);
      ddp::SlidingWindows windows(norm.apply(csv.values), 1, 1);
      if (windows.size().value() > 0) (void)windows.get_batch({0});
    }
  } catch (const ddp::DataError&) {
  }
  return 0;
}

const ddp::fuzz::AddHarness kCsvSeriesHarness{"csv_series_fuzz", fuzz_csv_series};

}  // namespace
