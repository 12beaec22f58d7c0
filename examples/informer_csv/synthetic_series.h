// A deterministic synthetic multivariate series in the shape of the seed's
// datatry.csv (10,000 rows x 12 columns: a date and 11 variables): hourly
// rows, each variable a level, a trend, a daily and a weekly cycle and noise;
// the last one ("OT", as Informer's data sets call the target) mixes the others.
// The same bytes on every machine: own generator, no std:: distributions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace informer {

class Xorshift {
 public:
  explicit Xorshift(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) / 9007199254740992.0; }
  double normal() {  // Box-Muller
    const double u = uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }

 private:
  uint64_t s_;
};

inline void write_synthetic_series(const std::string& path, int rows = 10000, int variables = 11, uint64_t seed = 1) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  Xorshift rng(seed);
  struct Var { double level, trend, daily, weekly, phase, noise; };
  std::vector<Var> vars;
  for (int j = 0; j < variables; ++j)
    vars.push_back({10.0 * rng.uniform() - 5.0, 4.0 * rng.uniform() - 2.0, 1.0 + 2.0 * rng.uniform(),
                    0.5 + rng.uniform(), 6.283185307179586 * rng.uniform(), 0.1 + 0.2 * rng.uniform()});
  out << "date";
  for (int j = 0; j + 1 < variables; ++j) out << ",x" << j + 1;
  out << ",OT\n";
  const std::time_t start = 1577836800;  // 2020-01-01 00:00:00 UTC
  char buf[64];
  std::vector<double> row(static_cast<size_t>(variables));
  for (int t = 0; t < rows; ++t) {
    const std::time_t when = start + static_cast<std::time_t>(t) * 3600;
    std::tm tm{};
    gmtime_r(&when, &tm);
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    out << buf;
    const double day = 6.283185307179586 * t / 24.0, week = 6.283185307179586 * t / 168.0;
    for (int j = 0; j < variables; ++j) {
      const Var& v = vars[static_cast<size_t>(j)];
      row[static_cast<size_t>(j)] = v.level + v.trend * t / rows + v.daily * std::sin(day + v.phase) +
                                    v.weekly * std::sin(week + 2 * v.phase) + v.noise * rng.normal();
    }
    double ot = 0;
    for (int j = 0; j + 1 < variables; ++j) ot += row[static_cast<size_t>(j)] / (variables - 1);
    row.back() = 0.5 * row.back() + ot;
    for (double x : row) {
      std::snprintf(buf, sizeof buf, ",%.4f", x);
      out << buf;
    }
    out << "\n";
  }
  if (!out) throw std::runtime_error("writing " + path + " failed");
}

}  // namespace informer
