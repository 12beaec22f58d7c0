// Numbers read from outside text (environment variables, command lines,
// store values, data files): the whole text must be the number, in base 10,
// and in range. Torch-free; shared by the library and the launcher, each of
// which reports a bad value its own way (LaunchEnvError, UsageError, ddprun's
// usage message), so these return nullopt instead of throwing.
#pragma once

#include <limits>
#include <optional>
#include <string_view>

namespace ddp {

// "42", "-7"; not "", " 4", "4x", "0x10", "1e3", or a value outside [lo, hi].
std::optional<long long> parse_integer(std::string_view text, long long lo = std::numeric_limits<long long>::min(),
                                       long long hi = std::numeric_limits<long long>::max());

// A finite decimal number ("0.5", "-3", "1e-3"); not "", "nan", "inf", "1.5s".
std::optional<double> parse_number(std::string_view text);

// Seconds as ddprun and the library take them: a finite number >= 0 ("30", "0.1").
std::optional<double> parse_seconds(std::string_view text);

}  // namespace ddp
