#include "runtime/parse_number.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace ddp {

std::optional<long long> parse_integer(std::string_view text, long long lo, long long hi) {
  if (text.empty() || !(text[0] == '-' || text[0] == '+' || (text[0] >= '0' && text[0] <= '9'))) return std::nullopt;
  const std::string s(text);  // strtoll needs a terminated string
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE || end != s.c_str() + s.size() || end == s.c_str()) return std::nullopt;
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

std::optional<double> parse_number(std::string_view text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || end == s.c_str() || !std::isfinite(v)) return std::nullopt;
  // strtod reads hexadecimal floats ("0x1p3"); outside text never means those.
  if (s.find_first_of("xX") != std::string::npos) return std::nullopt;
  return v;
}

std::optional<double> parse_seconds(std::string_view text) {
  auto v = parse_number(text);
  if (!v || *v < 0) return std::nullopt;
  return v;
}

}  // namespace ddp
