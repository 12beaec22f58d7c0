#include "ddp/main_guard.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <typeinfo>

#include "ddp/errors.h"
#include "ddp/launch_env.h"

namespace ddp {

namespace {

// RANK is all we can trust before (or after a failed) init_process_group.
std::string rank_prefix() {
  return "rank " + rank_from_environment();
}

// Our own errors already start with "rank N"; LibTorch's carry a C++
// backtrace ("Exception raised from ...") that the one-line message drops.
std::string labelled(const std::string& what) {
  return what.rfind("rank ", 0) == 0 ? what : rank_prefix() + ": " + what;
}
std::string without_backtrace(const std::string& what) {
  const size_t trace = what.find("\nException raised from");
  return trace == std::string::npos ? what : what.substr(0, trace);
}

// "ddp::CommError", "c10::Error", "std::runtime_error".
std::string type_name(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name ? name.get() : mangled;
}

// A JSON string of pure ASCII: everything else as \uXXXX (surrogate pairs
// above U+FFFF), bytes that are not UTF-8 as U+FFFD, so any reader's
// encoding reads the same text.
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

bool write_whole_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  // rename: a reader (the launcher) sees the old file or the whole new one.
  ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

}  // namespace

bool record_error(const std::exception& error) noexcept {
  try {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (!path || !*path) return false;
    const std::string type = type_name(error);
    const std::string full = labelled(error.what());
    const std::string json =
        "{\"message\": {\"message\": " + json_string(type + ": " + without_backtrace(full)) +
        ", \"extraInfo\": {\"py_callstack\": " + json_string(type + ": " + full) +
        ", \"timestamp\": \"" + std::to_string(static_cast<long long>(std::time(nullptr))) + "\"}}}\n";
    return write_whole_file(path, json);
  } catch (...) {  // out of memory while reporting an error: the stderr line still comes
    return false;
  }
}

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Preempted& e) {
    record_error(e);  // ddprun's summary says why the worker exited 75
    std::cerr << e.what() << std::endl;
    return kPreemptedExitCode;
  } catch (const UsageError& e) {
    record_error(e);
    std::cerr << rank_prefix() << ": error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    record_error(e);
    std::cerr << "error: " << without_backtrace(labelled(e.what())) << std::endl;
    return 1;
  }
}

}  // namespace ddp
