// A round's failure record as it travels through the rendezvous store: the
// exit code, whether a restart may follow ("1"), may not ("0"), or is a
// membership change ("m"), one line of text, then the worker's message.
#include <climits>

#include "rendezvous.h"
#include "runtime/parse_number.h"

namespace ddprun {

std::string FailureRecord::serialize() const {
  std::string one_line = text;
  for (char& c : one_line)
    if (c == '\n') c = ' ';
  const char* kind = membership ? "m" : restartable ? "1" : "0";
  return std::to_string(exit_code) + "\n" + kind + "\n" + one_line +
         (message.empty() ? "" : "\n" + message.substr(0, kMaxMessage));
}

FailureRecord FailureRecord::parse(const std::string& s) {
  FailureRecord r;
  size_t a = s.find('\n');
  size_t b = a == std::string::npos ? std::string::npos : s.find('\n', a + 1);
  if (b == std::string::npos) {
    r.text = s;
    return r;
  }
  // A record is only read to report it: an unreadable exit code becomes 1.
  r.exit_code = static_cast<int>(ddp::parse_integer(s.substr(0, a), INT_MIN, INT_MAX).value_or(1));
  const std::string kind = s.substr(a + 1, b - a - 1);
  r.membership = kind == "m";
  r.restartable = kind == "1" || r.membership;
  size_t c = s.find('\n', b + 1);
  r.text = s.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1);
  if (c != std::string::npos) r.message = s.substr(c + 1, kMaxMessage);
  return r;
}

}  // namespace ddprun
