// Collects the warnings LibTorch's TORCH_WARN gives on this thread while one
// is alive, instead of printing them: a test checks that a warning came, as
// Python's warnings.catch_warnings does for PyTorch's.
#pragma once

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <string>
#include <vector>

namespace ddp::testing {

class WarningCapture final : public c10::WarningHandler {
 public:
  WarningCapture() : previous_(handler()) { set_handler(this); }
  ~WarningCapture() override { set_handler(previous_); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;

#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override { messages.push_back(msg); }
#endif

  // Whether a warning's message held `words`.
  bool saw(const std::string& words) const {
    for (const auto& m : messages)
      if (m.find(words) != std::string::npos) return true;
    return false;
  }

  std::vector<std::string> messages;

 private:
  // The handler's accessors moved from c10::Warning to c10::WarningUtils in 2.x.
#if TORCH_VERSION_MAJOR >= 2
  static c10::WarningHandler* handler() { return c10::WarningUtils::get_warning_handler(); }
  static void set_handler(c10::WarningHandler* h) { c10::WarningUtils::set_warning_handler(h); }
#else
  static c10::WarningHandler* handler() { return c10::Warning::get_warning_handler(); }
  static void set_handler(c10::WarningHandler* h) { c10::Warning::set_warning_handler(h); }
#endif
  c10::WarningHandler* previous_;
};

}  // namespace ddp::testing
