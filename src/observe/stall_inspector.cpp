#include "observe/stall_inspector.h"


#include <cstdlib>
#include <iostream>
#include <sstream>

#include "comm/work_handle.h"
#include "runtime/parse_number.h"
#include "usage_check.h"
#include "runtime/steady_clock.h"

namespace ddp {

namespace {

using detail::steady_ns;

}  // namespace

std::chrono::milliseconds StallInspector::threshold_for(double seconds, const ProcessGroup& pg) {
  if (const char* env = std::getenv("DDP_STALL_CHECK_TIME_SECONDS"); env && *env) {
    auto v = parse_number(env);
    check_usage(v.has_value() && *v >= 0, "rank ", pg.rank(), ": DDP_STALL_CHECK_TIME_SECONDS='", env,
                "' is not a number of seconds; give 60, or 0 to turn the stall inspector off");
    seconds = *v;
  }
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  auto ms = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  // Past the group's timeout the wait has already failed: report at half of it.
  if (ms >= pg.timeout()) ms = pg.timeout() / 2;
  return ms;
}

StallInspector::StallInspector(std::shared_ptr<ProcessGroup> pg, std::chrono::milliseconds threshold, int id)
    : pg_(std::move(pg)), threshold_(threshold), prefix_("ddp_stall/" + std::to_string(id) + "/") {
  thread_ = std::thread([this] { run(); });
}

StallInspector::~StallInspector() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StallInspector::set_buckets(std::vector<std::string> descriptions) {
  std::lock_guard<std::mutex> lock(mutex_);
  descriptions_ = std::move(descriptions);
}

void StallInspector::waiting(int64_t step, int bucket, int launched) {
  step_.store(step, std::memory_order_relaxed);
  bucket_.store(bucket, std::memory_order_relaxed);
  launched_.store(launched, std::memory_order_relaxed);
  if (since_ns_.load(std::memory_order_relaxed) == 0) since_ns_.store(steady_ns(), std::memory_order_release);
}

void StallInspector::done_waiting() { since_ns_.store(0, std::memory_order_release); }

void StallInspector::run() {
  // Ticks of a tenth of the threshold, at most a second: a wait longer than
  // a tick is posted, one longer than the threshold reported (once a bucket).
  const auto tick = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), threshold_ / 10 + std::chrono::milliseconds(1));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, tick, [this] { return stop_; })) {
    const int64_t since = since_ns_.load(std::memory_order_acquire);
    if (since == 0) continue;
    const int64_t waited_ms = (steady_ns() - since) / 1000000;
    const int64_t step = step_.load(std::memory_order_relaxed);
    const int bucket = bucket_.load(std::memory_order_relaxed);
    lock.unlock();
    try {
      if (waited_ms >= tick.count() && posted_step_ != step) post(step, launched_.load(std::memory_order_relaxed));
      if (waited_ms >= threshold_.count() && (reported_step_ != step || reported_bucket_ != bucket))
        report(step, bucket, waited_ms);
    } catch (const std::exception& e) {
      std::cerr << "rank " << pg_->rank() << ": DDP stall inspector: " << e.what() << std::endl;
      reported_step_ = step;  // say it once
      reported_bucket_ = bucket;
    }
    lock.lock();
  }
}

void StallInspector::post(int64_t step, int launched) {
  posted_step_ = step;
  const auto handle = pg_->store();
  c10d::Store* store = handle ? &**handle : nullptr;
  if (!store) return;
  const std::string value = std::to_string(step) + " " + std::to_string(launched);
  store->set(prefix_ + std::to_string(pg_->rank()), std::vector<uint8_t>(value.begin(), value.end()));
}

void StallInspector::report(int64_t step, int bucket, int64_t waited_ms) {
  reported_step_ = step;
  reported_bucket_ = bucket;
  std::ostringstream behind, seen;
  int missing = 0;
  const auto handle = pg_->store();
  c10d::Store* store = handle ? &**handle : nullptr;
  if (store) {
    for (int r = 0; r < pg_->size(); ++r) {
      if (r == pg_->rank()) continue;
      const std::string key = prefix_ + std::to_string(r);
      std::string status = "nothing";
      bool launched_it = false;
      if (store->check({key})) {
        auto bytes = store->get(key);
        std::istringstream in(std::string(bytes.begin(), bytes.end()));
        int64_t their_step = -1;
        int their_launched = 0;
        in >> their_step >> their_launched;
        launched_it = their_step > step || (their_step == step && their_launched > bucket);
        status = "step " + std::to_string(their_step) + ", " + std::to_string(their_launched) + " bucket(s) launched";
      }
      if (!launched_it) {
        behind << (missing++ ? ", " : "") << r;
        seen << (seen.tellp() > 0 ? "; " : "") << "rank " << r << ": " << status;
      }
    }
  }
  std::string holds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bucket >= 0 && bucket < static_cast<int>(descriptions_.size())) holds = descriptions_[bucket];
  }
  std::ostringstream msg;
  msg << "rank " << pg_->rank() << ": DDP stall: the all-reduce of bucket " << bucket << " of step " << step
      << " has waited " << waited_ms / 1000.0 << " s";
  if (!holds.empty()) msg << " (" << holds << ")";
  if (!store)
    msg << "; this process group has no store to ask the other ranks through.";
  else if (missing == 0)
    msg << "; every rank has launched it, so the link or a peer's network stack is slow.";
  else
    msg << "; rank(s) " << behind.str() << " have not launched it (last reported progress: " << seen.str() << ").";
  msg << " The job fails when the process group's timeout (" << pg_->timeout().count() / 1000
      << " s) runs out; a stuck rank's stack (gdb -p PID) or a slow one's data loading is the usual cause.";
  std::cerr << msg.str() << std::endl;
}

}  // namespace ddp
