// A progress bar for rank 0: step, loss, samples/s and time left. The rate
// shown is the recent one, smoothed as tqdm smooths it (an exponential
// moving average of samples and seconds between redraws, weight 0.3); the
// last line gives the whole epoch's average. On a
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
#include <optional>
#include <string>

namespace ddp {

class Progress {
 public:
  // `enabled` false (other ranks) makes every call a no-op. total_steps <= 0: unknown.
  Progress(std::string label, int64_t total_steps, bool enabled, std::ostream* out = nullptr);
  // One step done: its loss and how many samples it took (all ranks together).
  void update(double loss, int64_t samples);
  // The same, where the loss is read only when shown: nullopt when
  // shows_next() said the next update draws nothing (then nothing is drawn).
  void update(std::optional<double> loss, int64_t samples);
  // Whether the next update() draws a line (and so needs its loss).
  bool shows_next() const;
  // The final line (on a terminal, ends the redrawn one).
  void finish();

  // The average since the bar started.
  double samples_per_second() const;
  // The smoothed recent rate (the average until the first redraw).
  double recent_samples_per_second() const;
  double elapsed_seconds() const;
  // Whether redrawing is used (stdout is this process's controlling terminal).
  bool interactive() const { return interactive_; }

 private:
  std::string line() const;
  void draw(std::chrono::steady_clock::time_point now);
  std::string label_;
  int64_t total_, step_ = 0, samples_ = 0, drawn_samples_ = 0;
  double loss_ = 0;
  // tqdm's EMA: sums weighted 0.3 for the newest interval.
  double ema_samples_ = 0, ema_seconds_ = 0;
  bool enabled_, interactive_;
  std::ostream* out_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

// "1h02m", "3m20s", "12s".
std::string format_duration(double seconds);

}  // namespace ddp
