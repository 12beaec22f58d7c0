// A round's end as it travels through the rendezvous store: the exit code,
// its kind (a failure that may be restarted "1", one that may not "0", or an
// admission of waiting nodes "m"), one line of text, then the worker's
// message.
#include <climits>

#include "rendezvous.h"
#include "runtime/parse_number.h"

namespace ddprun {

RoundEnd RoundEnd::failure(int exit_code, bool restartable, std::string text) {
  RoundEnd r;
  r.exit_code = exit_code;
  r.restartable = restartable;
  r.text = std::move(text);
  return r;
}

RoundEnd RoundEnd::admission(std::string why) {
  RoundEnd r = failure(0, true, std::move(why));
  r.kind = Kind::Admission;
  return r;
}

std::string RoundEnd::serialize() const {
  std::string one_line = text;
  for (char& c : one_line)
    if (c == '\n') c = ' ';
  const char* kind_code = admits_nodes() ? "m" : restartable ? "1" : "0";
  return std::to_string(exit_code) + "\n" + kind_code + "\n" + one_line +
         (message.empty() ? "" : "\n" + message.substr(0, kMaxMessage));
}

RoundEnd RoundEnd::parse(const std::string& s) {
  RoundEnd r;
  size_t a = s.find('\n');
  size_t b = a == std::string::npos ? std::string::npos : s.find('\n', a + 1);
  if (b == std::string::npos) {
    r.text = s;
    return r;
  }
  // A round end is only read to act on it and report it: an unreadable exit
  // code becomes 1, an unknown kind a failure that is not restarted.
  r.exit_code = static_cast<int>(ddp::parse_integer(s.substr(0, a), INT_MIN, INT_MAX).value_or(1));
  const std::string kind_code = s.substr(a + 1, b - a - 1);
  if (kind_code == "m") r.kind = Kind::Admission;
  r.restartable = kind_code == "1" || r.admits_nodes();
  size_t c = s.find('\n', b + 1);
  r.text = s.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1);
  if (c != std::string::npos) r.message = s.substr(c + 1, kMaxMessage);
  return r;
}

}  // namespace ddprun
