#include "wait.h"

#include <thread>

namespace ddprun {

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool wait_until(Clock::time_point deadline, const std::function<void()>& tick, Clock::duration poll_interval,
                const std::function<bool()>& done, const Notice& notice) {
  bool noticed = false;
  for (;;) {
    if (done()) return true;
    auto now = Clock::now();
    if (now > deadline) return false;
    if (!noticed && notice.say && now > notice.at) {
      noticed = true;
      notice.say();
    }
    if (tick) tick();
    std::this_thread::sleep_for(poll_interval);
  }
}

}  // namespace ddprun
