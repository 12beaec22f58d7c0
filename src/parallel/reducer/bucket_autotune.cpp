#include "parallel/reducer/bucket_autotune.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace ddp {

BucketAutotune::BucketAutotune(std::vector<double> caps_mb, int warmup, int timed, int passes)
    : caps_(std::move(caps_mb)), warmup_(warmup), timed_(std::max(timed, 1)), times_(caps_.size()) {
  if (caps_.empty()) throw std::logic_error("BucketAutotune: no candidate");
  for (int pass = 0; pass < std::max(passes, 1); ++pass)
    for (size_t k = 0; k < caps_.size(); ++k) visits_.push_back(pass % 2 == 0 ? k : caps_.size() - 1 - k);
}

BucketAutotune::Next BucketAutotune::after_step(double ms) {
  if (done_) return Next::keep;
  const size_t cap = visits_[visit_];
  // A visit that goes on with the cap before it (where the order turns)
  // needs no warm-up: the buckets stay.
  const int warmup = visit_ > 0 && visits_[visit_ - 1] == cap ? 0 : warmup_;
  if (++steps_ <= warmup) return Next::keep;
  times_[cap].push_back(ms);
  if (steps_ - warmup < timed_) return Next::keep;
  steps_ = 0;
  if (++visit_ == visits_.size()) return Next::agree;
  return visits_[visit_] == cap ? Next::keep : Next::switch_;
}

double BucketAutotune::agree(ProcessGroup& pg) {
  std::vector<float> medians;
  for (auto t : times_) {
    std::sort(t.begin(), t.end());
    medians.push_back(t.empty() ? 0.0f : static_cast<float>(t[t.size() / 2]));
  }
  auto mine = torch::tensor(medians, torch::kFloat32).to(pg.device());
  auto slowest = mine.cpu();
  if (pg.size() > 1) {
    for (const auto& other : pg.allgather(mine)) slowest = torch::maximum(slowest, other.cpu());
  }
  const float* cost = slowest.data_ptr<float>();
  size_t best = 0;
  trials_.clear();
  for (size_t k = 0; k < caps_.size(); ++k) {
    trials_.push_back({caps_[k], cost[k]});
    if (cost[k] < cost[best]) best = k;
  }
  visits_ = {best};
  visit_ = 0;
  done_ = true;
  return caps_[best];
}

std::string BucketAutotune::summary() const {
  std::string s;
  char cell[64];
  for (const auto& t : trials_) {
    std::snprintf(cell, sizeof cell, "%s%g MB: %.1f ms", s.empty() ? "" : ", ", t.cap_mb, t.ms);
    s += cell;
  }
  std::snprintf(cell, sizeof cell, " -> %g MB", current_cap_mb());
  return s + cell;
}

}  // namespace ddp
