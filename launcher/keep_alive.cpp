// The store rendezvous's keep-alive (keep_alive.h).
#include "keep_alive.h"

namespace ddprun {

KeepAlive::KeepAlive(StoreLink& link, const RoundState& round, const RdzvConf& conf)
    : link_(link),
      round_(round),
      interval_(seconds(conf.keep_alive_interval)),
      limit_s_(conf.keep_alive_interval * conf.keep_alive_max_attempt),
      limit_(seconds(limit_s_)) {}

void KeepAlive::start() {
  seen_.assign(round_.size, -1);
  changed_.assign(round_.size, Clock::now());
  next_beat_ = Clock::now();
}

bool KeepAlive::beat(Clock::time_point now) {
  if (now < next_beat_) return false;
  next_beat_ = now + interval_;
  link_.watch().add(round_.alive(round_.rank), 1);
  return true;
}

bool KeepAlive::lapsed(int i, Clock::time_point now) {
  const int64_t v = link_.watch().add(round_.alive(i), 0);
  if (v != seen_[i]) {
    seen_[i] = v;
    changed_[i] = now;
    return false;
  }
  return now - changed_[i] > limit_;
}

int KeepAlive::lapsed_others() {
  int quiet = 0;
  for (int i = 0; i < round_.size; ++i) quiet += i != round_.rank && lapsed(i, Clock::now());
  return quiet;
}

}  // namespace ddprun
