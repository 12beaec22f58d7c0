#include "error_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "fd.h"
#include "runtime/regular_file.h"

namespace ddprun {
namespace {

// Just enough JSON for the error file: a value tree, built by a recursive
// descent parser that gives up (returns false) at the first surprise.
struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  std::string text;  // String: the decoded text; Number: its spelling
  std::vector<std::pair<std::string, Json>> members;  // those get() may ask for

  const Json* get(const std::string& key) const {
    if (kind != Kind::Object) return nullptr;
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
};

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  bool document(Json& out) {
    if (!value(out, 0)) return false;
    skip_space();
    return at_ == s_.size();
  }

 private:
  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  bool value(Json& out, int depth) {
    if (depth > kMaxDepth) return false;
    skip_space();
    if (at_ >= s_.size()) return false;
    switch (s_[at_]) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"': out.kind = Json::Kind::String; return string(out.text);
      case 't': out.kind = Json::Kind::Bool; out.text = "true"; return literal("true");
      case 'f': out.kind = Json::Kind::Bool; out.text = "false"; return literal("false");
      case 'n': out.kind = Json::Kind::Null; return literal("null");
      default: out.kind = Json::Kind::Number; return number(out.text);
    }
  }

  bool object(Json& out, int depth) {
    out.kind = Json::Kind::Object;
    ++at_;  // '{'
    skip_space();
    if (at_ < s_.size() && s_[at_] == '}') return ++at_, true;
    for (;;) {
      skip_space();
      std::string key;
      if (at_ >= s_.size() || s_[at_] != '"' || !string(key)) return false;
      skip_space();
      if (at_ >= s_.size() || s_[at_++] != ':') return false;
      Json v;
      if (!value(v, depth + 1)) return false;
      // Only the keys of the error record are kept: a file of a million
      // members or items costs no more memory than its own size.
      if (key == "message" || key == "extraInfo" || key == "py_callstack" || key == "timestamp")
        out.members.emplace_back(std::move(key), std::move(v));
      skip_space();
      if (at_ >= s_.size()) return false;
      char c = s_[at_++];
      if (c == '}') return true;
      if (c != ',') return false;
    }
  }

  bool array(Json& out, int depth) {
    out.kind = Json::Kind::Array;
    ++at_;  // '['
    skip_space();
    if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
    for (;;) {
      Json v;
      if (!value(v, depth + 1)) return false;
      skip_space();
      if (at_ >= s_.size()) return false;
      char c = s_[at_++];
      if (c == ']') return true;
      if (c != ',') return false;
    }
  }

  bool number(std::string& out) {
    size_t start = at_;
    auto digits = [&] {
      size_t d = at_;
      while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
      return at_ > d;
    };
    if (at_ < s_.size() && s_[at_] == '-') ++at_;
    if (!digits()) return false;
    if (at_ < s_.size() && s_[at_] == '.') {
      ++at_;
      if (!digits()) return false;
    }
    if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
      ++at_;
      if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) ++at_;
      if (!digits()) return false;
    }
    out.assign(s_.substr(start, at_ - start));
    return true;
  }

  bool hex4(unsigned& v) {
    if (s_.size() - at_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[at_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else return false;
    }
    return true;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool string(std::string& out) {
    ++at_;  // '"'
    for (;;) {
      if (at_ >= s_.size()) return false;
      char c = s_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= s_.size()) return false;
      char e = s_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {
            // A high surrogate pairs with a following \uDC00-\uDFFF; alone it is U+FFFD.
            unsigned low;
            size_t save = at_;
            if (s_.substr(at_, 2) == "\\u" && (at_ += 2, hex4(low)) && low >= 0xDC00 && low < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              at_ = save;
              cp = 0xFFFD;
            }
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            cp = 0xFFFD;
          }
          utf8(out, cp);
          break;
        }
        default: return false;
      }
    }
  }

  std::string_view s_;
  size_t at_ = 0;
};

// Terminal-safe and bounded: what a worker wrote must not move the cursor,
// change colours or flood the console.
std::string displayable(const std::string& text) {
  std::string out = text.substr(0, kMaxErrorTextBytes);
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7F) c = '?';
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (text.size() > kMaxErrorTextBytes) out += "... (" + std::to_string(text.size() - kMaxErrorTextBytes) + " bytes cut)";
  return out;
}

std::optional<long long> seconds_of(const Json* v) {
  if (!v || (v->kind != Json::Kind::String && v->kind != Json::Kind::Number) || v->text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  // Python writes str(int(time.time())); a float is accepted and truncated.
  double d = std::strtod(v->text.c_str(), &end);
  if (errno || end != v->text.c_str() + v->text.size() || !(d > 0) || d > 1e11) return std::nullopt;
  return static_cast<long long>(d);
}

}  // namespace

std::optional<WorkerError> parse_error_json(std::string_view text) {
  try {
    Json root;
    if (!Parser(text).document(root)) return std::nullopt;
    const Json* message = root.get("message");
    if (!message) return std::nullopt;
    WorkerError e;
    if (message->kind == Json::Kind::String) {
      // torchrun's older shape: {"message": "...", "timestamp": 1700000000}
      e.message = message->text;
      e.traceback = message->text;
      e.timestamp = seconds_of(root.get("timestamp"));
    } else {
      const Json* text_v = message->get("message");
      if (!text_v || text_v->kind != Json::Kind::String) return std::nullopt;
      e.message = text_v->text;
      e.traceback = e.message;
      if (const Json* extra = message->get("extraInfo")) {
        const Json* stack = extra->get("py_callstack");
        if (stack && stack->kind == Json::Kind::String && !stack->text.empty()) e.traceback = stack->text;
        e.timestamp = seconds_of(extra->get("timestamp"));
      }
    }
    e.message = displayable(e.message);
    e.traceback = displayable(e.traceback);
    if (e.message.empty()) return std::nullopt;
    return e;
  } catch (const std::exception&) {  // bad_alloc on a pathological input: show nothing
    return std::nullopt;
  }
}

std::optional<WorkerError> read_error_file(const std::string& path, std::string* problem) {
  auto fail = [&](const std::string& why) -> std::optional<WorkerError> {
    if (problem) *problem = why;
    return std::nullopt;
  };
  if (problem) problem->clear();
  if (path.empty()) return std::nullopt;
  // O_NONBLOCK: a FIFO in its place must not hang the launcher.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return errno == ENOENT ? std::nullopt : fail(std::string("cannot open it: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(std::string("cannot stat it: ") + std::strerror(errno));
  if (const std::string why = ddp::why_not_regular(st); !why.empty()) return fail(why);
  if (static_cast<unsigned long long>(st.st_size) > kMaxErrorFileBytes)
    return fail("larger than " + std::to_string(kMaxErrorFileBytes) + " bytes");
  std::string text(kMaxErrorFileBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxErrorFileBytes) return fail("larger than " + std::to_string(kMaxErrorFileBytes) + " bytes");
  text.resize(got);
  auto e = parse_error_json(text);
  if (!e) return fail("not an error record in torchrun's JSON shape");
  return e;
}

}  // namespace ddprun
