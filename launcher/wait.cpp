#include "wait.h"

#include <algorithm>
#include <thread>

namespace ddprun {

Clock::duration seconds(double s) {
  // The command line takes any finite number of seconds, but past ~292 years
  // the conversion to nanoseconds is undefined behaviour (ddprun
  // --term-timeout 1e300, replayed by fuzz/ddprun_cli_fuzz), and a deadline
  // far past now overflows the clock. A century is "never" for a launcher.
  constexpr double kCentury = 100.0 * 365 * 24 * 3600;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(s, kCentury)));
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
