#include "ddp/runtime/hostlist.h"

#include <cctype>

#include "ddp/errors.h"
#include "runtime/parse_number.h"

namespace ddp {
namespace {

// More host names than any cluster has (the largest have ~10^5 nodes): a
// list that expands past this is corrupt, and expanding it anyway would take
// gigabytes ("n[0-999999][0-999999]" is 10^12 names).
constexpr size_t kMaxHosts = size_t(1) << 20;

[[noreturn]] void fail(const std::string& text, size_t pos, const std::string& what) {
  throw LaunchEnvError("malformed Slurm host list '" + text + "' at position " +
                              std::to_string(pos) + ": " + what);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// Expands the values inside one pair of brackets ("01-03,07") into strings
// that keep the zero padding of the lower bound.
std::vector<std::string> expand_range_set(const std::string& text, size_t at, const std::string& body) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    std::string item = body.substr(start, comma - start);
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) fail(text, at + start, "expected N or N-M inside brackets, got '" + item + "'");
    // Digits only, so the one way to fail is a number past long long.
    const auto a = parse_integer(lo, 0), b = parse_integer(hi, 0);
    if (!a || !b) fail(text, at + start, "number in '" + item + "' is too large");
    if (*b < *a) fail(text, at + start, "range '" + item + "' runs backwards");
    if (static_cast<unsigned long long>(*b - *a) >= kMaxHosts - out.size())
      fail(text, at + start, "range '" + item + "' is too large (more than " + std::to_string(kMaxHosts) + " hosts)");
    size_t width = lo.size();
    // By count, not `v <= b`: at b = LLONG_MAX that would never end.
    for (long long k = 0; k <= *b - *a; ++k) {
      std::string digits = std::to_string(*a + k);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      out.push_back(digits);
    }
    start = comma + 1;
  }
  return out;
}

// Expands one comma-free entry such as "rack[1-2]-n[01-02]".
void expand_entry(const std::string& text, size_t at, const std::string& entry, std::vector<std::string>& out) {
  std::vector<std::string> prefixes{""};
  size_t i = 0;
  while (i < entry.size()) {
    size_t open = entry.find('[', i);
    std::string literal = entry.substr(i, open == std::string::npos ? std::string::npos : open - i);
    if (literal.find(']') != std::string::npos) fail(text, at + i, "']' without '['");
    for (auto& p : prefixes) p += literal;
    if (open == std::string::npos) break;
    size_t close = entry.find(']', open);
    if (close == std::string::npos) fail(text, at + open, "'[' without ']'");
    auto values = expand_range_set(text, at + open + 1, entry.substr(open + 1, close - open - 1));
    if (prefixes.size() * values.size() > kMaxHosts - out.size())
      fail(text, at + open, "expands to more than " + std::to_string(kMaxHosts) + " hosts");
    std::vector<std::string> next;
    next.reserve(prefixes.size() * values.size());
    for (const auto& p : prefixes)
      for (const auto& v : values) next.push_back(p + v);
    prefixes.swap(next);
    i = close + 1;
  }
  for (auto& p : prefixes) out.push_back(std::move(p));
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    char c = i < hostlist.size() ? hostlist[i] : ',';
    if (c == '[') {
      if (++depth > 1) fail(hostlist, i, "nested '['");
    } else if (c == ']') {
      if (--depth < 0) fail(hostlist, i, "']' without '['");
    } else if (c == ',' && depth == 0) {
      std::string entry = hostlist.substr(start, i - start);
      if (entry.empty()) fail(hostlist, i, "empty host name");
      if (entry.find_first_of(" \t") != std::string::npos) fail(hostlist, start, "whitespace in host name");
      expand_entry(hostlist, start, entry, hosts);
      start = i + 1;
    }
  }
  if (depth != 0) fail(hostlist, hostlist.size(), "'[' without ']'");
  return hosts;
}

std::string first_host(const std::string& hostlist) {
  auto hosts = expand_hostlist(hostlist);
  return hosts.front();
}

}  // namespace ddp
