// A progress bar for rank 0: step, loss, samples/s and time left. On a
// terminal it redraws one line; when stdout is anything else (a pipe or a
// file: ddprun's prefixed output, a batch job's log; the pseudo-terminal
// mpirun gives each rank, or TERM=dumb) it prints a plain line every tenth of
// the way and one at the end instead, with no carriage return or escape
// sequence, so logs stay readable.
//
//   ddp::Progress bar("epoch 3/10", steps_per_epoch, pg->rank() == 0);
//   for (...) { ...; bar.update(loss.item<double>(), global_batch); }
//   bar.finish();
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace ddp {

class Progress {
 public:
  // `enabled` false (other ranks) makes every call a no-op. total_steps <= 0: unknown.
  Progress(std::string label, int64_t total_steps, bool enabled, std::ostream* out = nullptr);
  // One step done: its loss and how many samples it took (all ranks together).
  void update(double loss, int64_t samples);
  // The final line (on a terminal, ends the redrawn one).
  void finish();

  double samples_per_second() const;
  double elapsed_seconds() const;
  // Whether redrawing is used (stdout is this process's controlling terminal).
  bool interactive() const { return interactive_; }

 private:
  std::string line() const;
  std::string label_;
  int64_t total_, step_ = 0, samples_ = 0;
  double loss_ = 0, loss_sum_ = 0;
  bool enabled_, interactive_;
  std::ostream* out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

// "1h02m", "3m20s", "12s".
std::string format_duration(double seconds);

}  // namespace ddp
