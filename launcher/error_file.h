// The error file a worker leaves behind when it dies of an uncaught error:
// ddprun gives every worker TORCHELASTIC_ERROR_FILE (a path of its own per
// attempt and local rank, as torchrun does), and the worker's outermost
// frame writes torchrun's JSON there (Python's @record, ddp::guarded_main,
// ddp::record_error):
//   {"message": {"message": "ddp::CommError: rank 3: ...",
//                "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}
// or torchrun's older {"message": "...", "timestamp": 1700000000}. The
// failure summary shows it. The file is outside input (a worker may write
// anything there, or a FIFO, or gigabytes): reading it is bounded in size
// and time, and anything that is not that shape is simply not shown.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

struct WorkerError {
  std::string message;    // "ExceptionType: text"
  std::string traceback;  // extraInfo.py_callstack, else the message (torchrun's rule)
  std::optional<long long> timestamp;  // Unix seconds, when the file has a usable one
};

// Files above this are not read (a traceback is kilobytes).
constexpr size_t kMaxErrorFileBytes = 1 << 20;
// Longest message or traceback kept; longer ones end in "... (N bytes cut)".
constexpr size_t kMaxErrorTextBytes = 16 << 10;

// Parses the JSON of an error file. nullopt unless it is one of the shapes
// above with a non-empty message. Control characters other than newline and
// tab are replaced with '?' (the text goes to a terminal), and both texts
// are cut at kMaxErrorTextBytes. Never throws on any input; nesting deeper
// than 64 levels is rejected rather than recursed into.
std::optional<WorkerError> parse_error_json(std::string_view text);

// Reads and parses `path`. nullopt when there is nothing to show; `problem`
// (if given) then says why for a file that exists but was not used (not a
// regular file, too large, not in torchrun's shape), and stays empty when
// there is no file. Never blocks on a FIFO; never throws.
std::optional<WorkerError> read_error_file(const std::string& path, std::string* problem = nullptr);

}  // namespace ddprun
