#include "runtime/json_text.h"

#include <cstdio>

namespace ddp {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  auto u = [&](unsigned v) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", v);
    out += buf;
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '"') out += "\\\"";
      else if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c < 0x20 || c == 0x7f) u(c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // The length and smallest value of a well-formed sequence starting with c.
    const int len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    unsigned cp = len == 4 ? c & 0x07 : len == 3 ? c & 0x0F : c & 0x1F;
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      ok = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    ok = ok && cp >= (len == 4 ? 0x10000u : len == 3 ? 0x800u : 0x80u) && cp <= 0x10FFFF &&
         !(cp >= 0xD800 && cp < 0xE000);
    if (!ok) {
      u(0xFFFD);
      ++i;
      continue;
    }
    if (cp >= 0x10000) {
      u(0xD800 + ((cp - 0x10000) >> 10));
      u(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      u(cp);
    }
    i += static_cast<size_t>(len);
  }
  return out + "\"";
}

}  // namespace ddp
