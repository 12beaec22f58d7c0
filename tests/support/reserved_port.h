// The tests' reserved ports: src/runtime/reserved_port.h says what a
// reservation guarantees. Each test runs in a process of its own
// (gtest_discover_tests), so its reservations end with it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>

#include "../../src/runtime/reserved_port.h"

namespace ddp::testing {

inline uint16_t reserved_port() {
  try {
    return ddp::detail::reserve_port();
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("reserved_port: cannot reserve a port: ") + e.what());
  }
}

}  // namespace ddp::testing
