// The reducer's observers (observers.h): runtime figures, timeline, stall
// inspector, automatic bucket size.
#include "parallel/reducer/observers.h"

#include <algorithm>
#include <iostream>

#include "ddp/observe/timeline.h"

namespace ddp::detail {

// ---- runtime figures ----------------------------------------------------

namespace {

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::max(0.0, std::chrono::duration<double, std::milli>(to - from).count());
}

}  // namespace

void RuntimeFigures::buckets_laid_out(const BucketSet& buckets) {
  stats_.num_buckets = buckets.size();
  stats_.bucket_bytes.clear();
  for (const auto& b : buckets) stats_.bucket_bytes.push_back(b.bytes());
  bytes_ = buckets.total_bytes();
}

void RuntimeFigures::step_finished(const StepEnd& end) {
  auto& s = stats_;
  s.bytes_reduced = bytes_ - end.bytes_skipped;
  s.num_buckets_reduced = s.num_buckets - end.buckets_skipped;
  s.backward_ms = std::chrono::duration<double, std::milli>(end.backward_end - first_ready_).count();
  s.exposed_comm_ms = std::chrono::duration<double, std::milli>(end.wait_end - end.wait_start).count();
  s.forward_ms = ms_between(forward_start_, output_ready_);
  s.backward_compute_ms = ms_between(output_ready_, end.backward_end);
  s.comm_ms = end.communicated ? ms_between(comm_start_, end.wait_end) : 0;
  s.overlap_ms = end.communicated ? ms_between(comm_start_, end.backward_end) : 0;
  // Steady times as system-clock ns, for PyTorch's *_time_start/_end.
  const auto steady_now = Clock::now();
  const auto system_now = std::chrono::system_clock::now().time_since_epoch();
  auto wall_ns = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(system_now - (steady_now - t)).count();
  };
  s.at_ns = {wall_ns(forward_start_), wall_ns(output_ready_), wall_ns(end.backward_end),
             end.communicated ? wall_ns(comm_start_) : 0, end.communicated ? wall_ns(end.wait_end) : 0};
  s.unused_parameter_bytes = end.unused_parameter_bytes;
  s.ready_order.swap(*end.ready_order);  // the reducer clears the other, keeping its capacity
  const double n = static_cast<double>(s.iterations);
  auto& m = s.mean;
  m.forward_ms += (s.forward_ms - m.forward_ms) / n;
  m.backward_compute_ms += (s.backward_compute_ms - m.backward_compute_ms) / n;
  m.comm_ms += (s.comm_ms - m.comm_ms) / n;
  m.overlap_ms += (s.overlap_ms - m.overlap_ms) / n;
  m.exposed_comm_ms += (s.exposed_comm_ms - m.exposed_comm_ms) / n;
}

// ---- timeline -----------------------------------------------------------

TimelineRecorder::TimelineRecorder(std::shared_ptr<Timeline> timeline, const BucketSet& buckets)
    : timeline_(std::move(timeline)), marks_(buckets.size()) {}

void TimelineRecorder::buckets_laid_out(const BucketSet& buckets) { marks_.assign(buckets.size(), {}); }

void TimelineRecorder::backward_started() {
  if (timeline_) backward_start_us_ = timeline_->now_us();
}

std::string TimelineRecorder::bucket_args(size_t k, const Bucket& b) const {
  return "\"bucket\": " + std::to_string(k) + ", \"bytes\": " + std::to_string(b.bytes()) + ", \"parameters\": " +
         std::to_string(b.vars.size()) + ", \"ready_us\": " + std::to_string(marks_[k].ready_us) +
         ", \"launch_us\": " + std::to_string(marks_[k].launch_us);
}

void TimelineRecorder::bucket_ready(size_t k) {
  if (!timeline_) return;
  marks_[k].ready_us = timeline_->now_us();
  timeline_->instant(Timeline::Row::compute, "bucket " + std::to_string(k) + " ready", marks_[k].ready_us,
                     "\"bucket\": " + std::to_string(k));
}

// Before the collective starts: its end can then never precede it.
void TimelineRecorder::bucket_launching(size_t k) {
  if (timeline_) marks_[k].launch_us = timeline_->now_us();
}

void TimelineRecorder::bucket_launched(size_t k, Bucket& b) {
  if (!timeline_) return;
  const std::string args = bucket_args(k, b);
  timeline_->bucket_launched(static_cast<int>(k), marks_[k].launch_us, args);
  // The backend's thread reports the end; it must not take the reducer's
  // lock, which the thread waiting for that end may hold.
  std::weak_ptr<Timeline> weak = timeline_;
  marks_[k].end_reported = b.reduced.on_complete([weak, k, launch = marks_[k].launch_us, args] {
    if (auto t = weak.lock()) t->communication_done("bucket " + std::to_string(k), launch, args);
  });
}

void TimelineRecorder::wait_started() {
  if (timeline_) wait_start_us_ = timeline_->now_us();
}

void TimelineRecorder::bucket_done(size_t k, const Bucket& b) {
  if (timeline_ && !marks_[k].end_reported)
    timeline_->communication_done("bucket " + std::to_string(k), marks_[k].launch_us, bucket_args(k, b));
}

void TimelineRecorder::wait_ended(bool completed) {
  if (!timeline_ || !completed) return;
  timeline_->span(Timeline::Row::compute, "backward", backward_start_us_, wait_start_us_);
  timeline_->span(Timeline::Row::compute, "wait for communication", wait_start_us_, timeline_->now_us());
}

void TimelineRecorder::step_counted(int64_t step) {
  if (!timeline_) return;
  timeline_->set_step(step);
  if (timeline_->skew_due()) timeline_->report_skew();
}

// The step counts on a joined rank too, so that the skew reports' gathers match.
void TimelineRecorder::shadow_step_finished() {
  if (!timeline_) return;
  timeline_->set_step(timeline_->step() + 1);
  if (timeline_->skew_due()) timeline_->report_skew();
}

// ---- stall inspector ----------------------------------------------------

void StallWatch::buckets_laid_out(const BucketSet& buckets) {
  // What each bucket holds, for the stall report; the usage map last.
  std::vector<std::string> holds;
  for (const auto& b : buckets) {
    std::string s = std::to_string(b.vars.size()) + " parameter(s), " + std::to_string(b.bytes()) + " bytes: ";
    for (size_t k = 0; k < b.vars.size() && k < 8; ++k) s += (k ? ", " : "") + names_[b.vars[k]];
    if (b.vars.size() > 8) s += ", ...";
    holds.push_back(std::move(s));
  }
  holds.push_back("the map of parameters used on each rank");
  inspector_->set_buckets(std::move(holds));
}

// ---- bucket_cap_mb("auto") ----------------------------------------------

BucketCapSearch::BucketCapSearch(const DDPOptions& options, ProcessGroup& pg, ReducerStats& stats,
                                 LayoutFor layout_for, std::string who)
    : options_(options), pg_(pg), stats_(stats), layout_for_(std::move(layout_for)), who_(std::move(who)) {}

// Tuning starts once the buckets follow the real ready order. Every rank
// runs this after the same steps, so all change buckets at the same step.
void BucketCapSearch::between_steps(double step_ms, bool layout_settled) {
  if (finished_ || !layout_settled) return;
  if (!autotune_) {
    // Only caps that pack different buckets are worth a trial.
    std::vector<double> caps;
    std::vector<Assignment> seen;
    for (double cap : options_.bucket_cap_candidates_mb()) {
      auto layout = layout_for_(cap);
      if (std::find(seen.begin(), seen.end(), layout) != seen.end()) continue;
      seen.push_back(std::move(layout));
      caps.push_back(cap);
    }
    autotune_ = std::make_unique<BucketAutotune>(caps, DDPOptions::kAutoBucketCapWarmupSteps,
                                                 DDPOptions::kAutoBucketCapTimedSteps);
    pending_cap_mb_ = autotune_->current_cap_mb();
    if (caps.size() == 1) finish();
    return;
  }
  switch (autotune_->after_step(step_ms)) {
    case BucketAutotune::Next::keep:
      return;
    case BucketAutotune::Next::switch_:
      pending_cap_mb_ = autotune_->current_cap_mb();
      return;
    case BucketAutotune::Next::agree:
      pending_cap_mb_ = autotune_->agree(pg_);
      for (const auto& t : autotune_->trials()) stats_.bucket_cap_trials.emplace_back(t.cap_mb, t.ms);
      if (pg_.rank() == 0) std::cout << who_ << "bucket_cap_mb auto: " << autotune_->summary() << std::endl;
      finish();
      return;
  }
}

void BucketCapSearch::finish() {
  finished_ = true;
  stats_.bucket_cap_tuning = false;
}

double BucketCapSearch::take_pending_cap() {
  const double cap = pending_cap_mb_;
  pending_cap_mb_ = 0;
  return cap;
}

}  // namespace ddp::detail
