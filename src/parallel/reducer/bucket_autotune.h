// bucket_cap_mb("auto"): the search behind it. Which candidate cap the next
// synchronised steps run with, what each one cost, and which one every rank
// keeps. The reducer supplies the steps' times and lays the buckets out; this
// file only decides (and, once, agrees across ranks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

class BucketAutotune {
 public:
  // `caps_mb`: the candidates (at least one). They are visited in order,
  // then in reverse order (`passes` 2: a slow start or a drift of the
  // machine then weighs on all alike), and so on; each visit runs `warmup`
  // uncounted steps (none where the order turns and the cap stays), then
  // `timed` counted ones.
  BucketAutotune(std::vector<double> caps_mb, int warmup, int timed, int passes = 2);

  enum class Next {
    keep,     // go on with the current cap
    switch_,  // lay the buckets out for current_cap_mb() before the next forward
    agree,    // every candidate is timed: call agree() now (collective)
  };
  // After a synchronised step run with current_cap_mb(): its backward plus
  // exposed communication on this rank, in ms (0 on a rank that only
  // shadowed the step under ddp::Join).
  Next after_step(double ms);

  double current_cap_mb() const { return caps_[visits_[std::min(visit_, visits_.size() - 1)]]; }
  bool done() const { return done_; }

  // Collective (an all-gather on `pg`): each candidate's cost is the slowest
  // rank's median; the cheapest wins (the smaller cap on a tie), the same on
  // every rank. Returns the winning cap, also current_cap_mb() from then on.
  double agree(ProcessGroup& pg);

  // Each candidate's agreed cost, ms, in the order tried (after agree()).
  struct Trial {
    double cap_mb;
    double ms;
  };
  const std::vector<Trial>& trials() const { return trials_; }
  // "1 MB: 412.0 ms, 5 MB: 398.1 ms, ... -> 5 MB" (after agree()).
  std::string summary() const;

 private:
  std::vector<double> caps_;
  int warmup_, timed_;
  std::vector<size_t> visits_;  // candidate indices, in the order visited
  size_t visit_ = 0;
  int steps_ = 0;  // in the current visit
  std::vector<std::vector<double>> times_;
  std::vector<Trial> trials_;
  bool done_ = false;
};

}  // namespace ddp
