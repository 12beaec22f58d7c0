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
  WarningCapture() : previous_(c10::Warning::get_warning_handler()) { c10::Warning::set_warning_handler(this); }
  ~WarningCapture() override { c10::Warning::set_warning_handler(previous_); }
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
  c10::WarningHandler* previous_;
};

}  // namespace ddp::testing
