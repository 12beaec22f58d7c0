// Worker output: every worker's stdout and stderr arrive on pipes that the
// monitor loop polls. Console copies get a "[rank3]: " prefix and are written
// one whole line at a time, so lines of different workers never mix; log
// files (--log-dir, --tee, --redirects) get the raw bytes.
//
// Log layout (like torchrun's):
//   LOG_DIR/RUN_ID_XXXXXX/attempt_N/LOCAL_RANK/stdout.log and stderr.log
#pragma once

#include <poll.h>

#include <chrono>
#include <string>
#include <vector>

#include "fd.h"

namespace ddprun {

// ddprun's own messages: "ddprun: ...", one write on stderr.
void say(const std::string& message);

class OutputRouter {
 public:
  enum class Stream { Out, Err };

  // Takes the read end of a worker pipe. `console`: copy lines to ddprun's
  // stdout (Out) or stderr (Err) with `prefix`; `file`: raw copy, may be empty.
  void add(UniqueFd pipe_read, Stream stream, std::string prefix, bool console, UniqueFd file);

  // Adds a pollfd for every open pipe.
  void append_pollfds(std::vector<pollfd>& fds) const;
  // Reads what one ready fd has (if it is ours) and forwards whole lines.
  bool handle(int fd);
  // Reads every pipe until EOF or `deadline` (grandchildren may hold a pipe
  // open; they are killed before this is called, the deadline is a backstop).
  void drain(std::chrono::steady_clock::time_point deadline);
  // Flushes partial lines (with a newline added) and closes everything.
  void close_all();
  bool empty() const { return sources_.empty(); }

 private:
  struct Source {
    UniqueFd fd;
    Stream stream;
    std::string prefix;
    bool console;
    UniqueFd file;
    std::string partial;  // console bytes after the last newline
  };
  void read_some(Source& s);
  void flush_partial(Source& s);
  std::vector<Source> sources_;
};

}  // namespace ddprun
