// A recoverable group's fault watcher (fault_watch.h).
#include "comm/recovery/fault_watch.h"

#include <algorithm>

#include "comm/recovery/recovery_keys.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
// How often the counters are read, and how often a rank beats.
constexpr auto kLook = std::chrono::milliseconds(50);
constexpr auto kBeat = std::chrono::milliseconds(250);

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

FaultWatch::FaultWatch(c10::intrusive_ptr<c10d::Store> store, int round, int slot, std::chrono::milliseconds deadline,
                       std::function<void()> abort)
    : store_(std::move(store)), round_(round), slot_(slot), deadline_(deadline), abort_(std::move(abort)) {
  lost_seen_ = store_->add(recovery_keys::lost_count(round_), 0);
  thread_ = std::thread([this] { run(); });
}

FaultWatch::~FaultWatch() { stop(); }

void FaultWatch::watch(int generation, const std::vector<int>& members) {
  const int64_t faults = store_->add(recovery_keys::faults(round_, generation), 0);
  std::lock_guard<std::mutex> lock(mutex_);
  ++epoch_;
  watching_ = true;
  generation_ = generation;
  members_ = members;
  generation_faults_ = faults;
  // The next member after this one, in a ring: every member is watched by one.
  const auto me = std::find(members.begin(), members.end(), slot_);
  neighbor_ = -1;
  if (members.size() >= 2 && me != members.end())
    neighbor_ = members[static_cast<size_t>(me - members.begin() + 1) % members.size()];
  neighbor_beat_ = -1;
  neighbor_since_ = Clock::now();
  lost_seen_ = -1;  // a member lost before this generation formed is looked for at once
}

void FaultWatch::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++epoch_;
  watching_ = false;
}

void FaultWatch::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void FaultWatch::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const int epoch = watching_ ? epoch_ : -1;
    lock.unlock();
    try {
      beat();
      // While the group re-forms too: the others wait for a silent member
      // until it is reported lost.
      if (epoch >= 0) look(epoch);
      else watch_neighbor(-1);
    } catch (const std::exception&) {
      // The store is gone: no collective can be trusted to end, and no
      // re-forming will succeed; the main thread reports it.
      if (epoch >= 0) fire(epoch);
    }
    lock.lock();
    cv_.wait_for(lock, kLook, [this] { return stop_; });
  }
}

void FaultWatch::beat() {
  const auto now = Clock::now();
  if (now < next_beat_) return;
  next_beat_ = now + kBeat;
  store_->add(recovery_keys::beat(round_, slot_), 1);
}

// One look at the counters, then at the neighbour's heartbeat.
void FaultWatch::look(int epoch) {
  int generation;
  int64_t generation_faults, lost_seen;
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = generation_;
    generation_faults = generation_faults_;
    members = members_;
    lost_seen = lost_seen_;
  }
  if (store_->add(recovery_keys::faults(round_, generation), 0) > generation_faults) return fire(epoch);
  const int64_t lost = store_->add(recovery_keys::lost_count(round_), 0);
  if (lost != lost_seen) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lost_seen_ = lost;
    }
    // ddprun's reports of workers already left out (a rank that ended after
    // the others re-formed without it) are no fault of this generation.
    for (int m : members)
      if (store_->check({recovery_keys::lost(round_, m)})) return fire(epoch);
  }
  watch_neighbor(epoch);
}

// The neighbour's heartbeat: silent for the deadline, it is reported lost
// (and, while a generation is watched, that generation aborted).
void FaultWatch::watch_neighbor(int epoch) {
  int neighbor;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    neighbor = neighbor_;
  }
  if (neighbor < 0) return;
  const int64_t beat = store_->add(recovery_keys::beat(round_, neighbor), 0);
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch >= 0 && epoch != epoch_) return;
  if (neighbor != neighbor_) return;
  if (beat != neighbor_beat_) {
    neighbor_beat_ = beat;
    neighbor_since_ = now;
    return;
  }
  if (now - neighbor_since_ < deadline_) return;
  const auto silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - neighbor_since_).count();
  store_->set(recovery_keys::lost(round_, neighbor),
              bytes("no heartbeat for " + std::to_string(silent_ms) + " ms (seen by launch rank " +
                    std::to_string(slot_) + ")"));
  store_->add(recovery_keys::lost_count(round_), 1);
  neighbor_ = -1;  // reported once
  if (epoch < 0 || !watching_) return;
  watching_ = false;
  ++epoch_;
  abort_();
}

void FaultWatch::fire(int epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch != epoch_ || !watching_) return;
  watching_ = false;
  ++epoch_;
  abort_();
}

}  // namespace ddp::detail
