// Writes the synthetic series the Informer example trains on:
//   informer_make_csv OUT.csv [rows=10000] [variables=11] [seed=1]
// -h/--help prints this usage; a bad argument is an error (status 2), never a
// file named after it.
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <string>

#include "synthetic_series.h"

namespace {

constexpr const char* kUsage =
    "usage: informer_make_csv OUT.csv [rows=10000] [variables=11] [seed=1]\n"
    "  writes a deterministic multivariate series (a date column and `variables` columns)\n";

// The whole text as a base-10 integer in [lo, hi], else nullopt.
std::optional<long long> integer(const std::string& text, long long lo, long long hi) {
  if (text.empty() || text[0] == ' ' || text[0] == '+') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

int usage_error(const std::string& what) {
  std::cerr << "informer_make_csv: " << what << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
  }
  if (argc < 2 || argc > 5) return usage_error(argc < 2 ? "no output file given" : "too many arguments");
  const std::string out = argv[1];
  if (out.empty() || out[0] == '-') return usage_error("unknown option '" + out + "' (the first argument is the CSV to write)");
  const auto rows = argc > 2 ? integer(argv[2], 1, 100000000) : 10000;
  if (!rows) return usage_error("rows must be a whole number in 1..100000000, got '" + std::string(argv[2]) + "'");
  const auto variables = argc > 3 ? integer(argv[3], 1, 10000) : 11;
  if (!variables) return usage_error("variables must be a whole number in 1..10000, got '" + std::string(argv[3]) + "'");
  const auto seed = argc > 4 ? integer(argv[4], 0, std::numeric_limits<long long>::max()) : 1;
  if (!seed) return usage_error("seed must be a whole number >= 0, got '" + std::string(argv[4]) + "'");
  try {
    informer::write_synthetic_series(out, static_cast<int>(*rows), static_cast<int>(*variables),
                                     static_cast<uint64_t>(*seed));
    std::cout << "wrote " << out << ": " << *rows << " rows, date + " << *variables << " variables" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "informer_make_csv: error: " << e.what() << std::endl;
    return 1;
  }
}
