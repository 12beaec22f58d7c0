// The steady clock as a count of nanoseconds: the time base of the
// timeline's events and the stall inspector's notes. Private to the core.
#pragma once

#include <chrono>
#include <cstdint>

namespace ddp::detail {

inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ddp::detail
