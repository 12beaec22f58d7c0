#include "bucket_autotune.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace ddp {

BucketAutotune::BucketAutotune(std::vector<double> caps_mb, int warmup, int timed)
    : caps_(std::move(caps_mb)), warmup_(warmup), timed_(std::max(timed, 1)), times_(caps_.size()) {
  if (caps_.empty()) throw std::logic_error("BucketAutotune: no candidate");
}

BucketAutotune::Next BucketAutotune::after_step(double ms) {
  if (done_) return Next::keep;
  if (++steps_ <= warmup_) return Next::keep;
  times_[current_].push_back(ms);
  if (static_cast<int>(times_[current_].size()) < timed_) return Next::keep;
  if (current_ + 1 < caps_.size()) {
    ++current_;
    steps_ = 0;
    return Next::switch_;
  }
  return Next::agree;
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
  current_ = best;
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
