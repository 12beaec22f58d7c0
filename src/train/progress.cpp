#include "ddp/train/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace ddp {
namespace {

// Whether stdout is a terminal someone watches: this process's controlling
// terminal. isatty() alone is not enough: Open MPI's mpirun gives every rank
// a pseudo-terminal of its own as stdout (so its output comes line by line)
// and copies what arrives there into mpirun's stdout, a file or a pipe as
// often as not; that pseudo-terminal is not the rank's controlling terminal.
bool stdout_is_the_terminal() {
  if (!::isatty(STDOUT_FILENO)) return false;
  const char* term = std::getenv("TERM");
  if (term && std::strcmp(term, "dumb") == 0) return false;
  // Fails (ENOTTY) unless stdout is the controlling terminal of this process.
  return ::tcgetpgrp(STDOUT_FILENO) != -1;
}

}  // namespace

std::string format_duration(double seconds) {
  if (seconds < 0) seconds = 0;
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

Progress::Progress(std::string label, int64_t total_steps, bool enabled, std::ostream* out)
    : label_(std::move(label)),
      total_(total_steps),
      enabled_(enabled),
      interactive_(out == nullptr && stdout_is_the_terminal()),
      out_(out ? out : &std::cout),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

double Progress::samples_per_second() const {
  const double s = elapsed_seconds();
  return s > 0 ? static_cast<double>(samples_) / s : 0.0;
}

double Progress::recent_samples_per_second() const {
  if (ema_seconds_ <= 0) return samples_per_second();  // no line drawn yet
  return ema_samples_ / ema_seconds_;  // the bias corrections of the two averages cancel
}

std::string Progress::line() const {
  char buf[256];
  const double elapsed = elapsed_seconds();
  std::string bar;
  if (total_ > 0) {
    const int width = 20, filled = static_cast<int>(width * std::min<int64_t>(step_, total_) / total_);
    bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
  }
  const std::string steps = total_ > 0 ? std::to_string(step_) + "/" + std::to_string(total_) : std::to_string(step_);
  const std::string left =
      total_ > 0 && step_ > 0 ? format_duration(elapsed / static_cast<double>(step_) * static_cast<double>(total_ - step_)) : "?";
  if (finished_)
    std::snprintf(buf, sizeof buf, "%s %sstep %s  loss %.4f  %.0f samples/s on average  %s", label_.c_str(),
                  bar.c_str(), steps.c_str(), loss_, samples_per_second(), format_duration(elapsed).c_str());
  else
    std::snprintf(buf, sizeof buf, "%s %sstep %s  loss %.4f  %.0f samples/s  %s left", label_.c_str(), bar.c_str(),
                  steps.c_str(), loss_, recent_samples_per_second(), left.c_str());
  return buf;
}

bool Progress::shows_next() const {
  if (!enabled_) return false;
  const int64_t next = step_ + 1;
  if (interactive_)
    return next == total_ || std::chrono::steady_clock::now() - last_draw_ > std::chrono::milliseconds(100);
  const int64_t every = total_ > 0 ? std::max<int64_t>(1, total_ / 10) : 50;
  return (next % every == 0 && next != total_) || next == total_;
}

void Progress::update(double loss, int64_t samples) { update(std::optional<double>(loss), samples); }

void Progress::update(std::optional<double> loss, int64_t samples) {
  if (!enabled_) return;
  // Without a loss nothing is drawn, even where time passed since the
  // caller asked shows_next(): a line never shows a stale loss.
  const bool shows = loss.has_value() && shows_next();
  ++step_;
  samples_ += samples;
  if (loss) loss_ = *loss;
  if (!shows) return;
  const auto now = std::chrono::steady_clock::now();
  if (interactive_) {
    draw(now);
    *out_ << "\r" << line() << "\033[K" << std::flush;
  } else if (step_ != total_) {
    draw(now);
    *out_ << line() << std::endl;
  }
}

// The samples and seconds since the last redraw join tqdm's averages.
void Progress::draw(std::chrono::steady_clock::time_point now) {
  constexpr double kWeight = 0.3;
  const double seconds = std::chrono::duration<double>(now - last_draw_).count();
  ema_samples_ = kWeight * static_cast<double>(samples_ - drawn_samples_) + (1 - kWeight) * ema_samples_;
  ema_seconds_ = kWeight * seconds + (1 - kWeight) * ema_seconds_;
  drawn_samples_ = samples_;
  last_draw_ = now;
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (interactive_)
    *out_ << "\r" << line() << "\033[K" << std::endl;
  else
    *out_ << line() << std::endl;
}

}  // namespace ddp
