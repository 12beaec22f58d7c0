// Python scripts of a test program run by one /usr/bin/python3 that has
// imported torch once (python_server.py): python_script(script, args) gives
// what `/usr/bin/python3 SCRIPT ARGS...` would print, as run() in
// python_run.h does, at a fork instead of an interpreter's start and an
// import of torch each. The server starts at the first call and ends with
// the program (at the end of its input). PYTHON_SERVER names the server's
// file (tests/train/CMakeLists.txt).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace ddp::testing {

class PythonServer {
 public:
  // A script's answer waits this long at most; then the server is stopped,
  // and started afresh by the next call.
  static constexpr int kTimeoutMs = 300 * 1000;

  ~PythonServer() { stop(); }

  std::string run(const std::vector<std::string>& argv) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pid_ <= 0 && !start()) return "FAILED(server): cannot start /usr/bin/python3 " + std::string(PYTHON_SERVER);
    char out_template[] = "/tmp/ddp_python_XXXXXX";
    const int out_fd = ::mkstemp(out_template);
    if (out_fd < 0) return "FAILED(server): mkstemp";
    ::close(out_fd);
    const std::string out_path = out_template;
    std::string request = out_path;
    for (const auto& a : argv) request += std::string(1, '\0') + a;
    request += '\n';
    std::string answer;
    const bool answered = write_all(request) && read_line(answer);
    std::ifstream in(out_path);
    std::stringstream text;
    text << in.rdbuf();
    ::unlink(out_path.c_str());
    if (!answered) {
      stop();
      return "FAILED(server): no answer within " + std::to_string(kTimeoutMs / 1000) + " s: " + text.str();
    }
    const int code = std::atoi(answer.c_str());
    // As pclose() reports an exit code, so callers see what run() gives.
    return code == 0 ? text.str() : "FAILED(" + std::to_string(code << 8) + "): " + text.str();
  }

 private:
  bool start() {
    int to[2], from[2];
    if (::pipe2(to, O_CLOEXEC) != 0) return false;
    if (::pipe2(from, O_CLOEXEC) != 0) {
      ::close(to[0]);
      ::close(to[1]);
      return false;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to[0], 0);
      ::dup2(from[1], 1);
      ::execl("/usr/bin/python3", "python3", PYTHON_SERVER, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    if (pid_ < 0) {
      ::close(to[1]);
      ::close(from[0]);
      return false;
    }
    requests_ = to[1];
    answers_ = from[0];
    pending_.clear();
    return true;
  }

  void stop() {
    if (requests_ >= 0) ::close(requests_);
    if (answers_ >= 0) ::close(answers_);
    requests_ = answers_ = -1;
    if (pid_ > 0) {
      // The end of its input ends it; one that does not within 5 s is killed.
      int status = 0;
      for (int i = 0; i < 500 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) ::usleep(10 * 1000);
      if (::waitpid(pid_, &status, WNOHANG) == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
    }
    pid_ = -1;
  }

  bool write_all(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(requests_, data.data() + done, data.size() - done);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  bool read_line(std::string& line) {
    for (;;) {
      const auto end = pending_.find('\n');
      if (end != std::string::npos) {
        line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return true;
      }
      pollfd p{answers_, POLLIN, 0};
      if (::poll(&p, 1, kTimeoutMs) != 1) return false;
      char buf[256];
      const ssize_t n = ::read(answers_, buf, sizeof buf);
      if (n <= 0) return false;
      pending_.append(buf, static_cast<size_t>(n));
    }
  }

  std::mutex mutex_;
  pid_t pid_ = -1;
  int requests_ = -1, answers_ = -1;
  std::string pending_;
};

// What `/usr/bin/python3 script args...` prints (stdout and stderr), prefixed
// "FAILED(status): " when it exits non-zero, from the program's one server.
inline std::string python_script(const std::string& script, const std::vector<std::string>& args) {
  static PythonServer server;
  std::vector<std::string> argv{script};
  argv.insert(argv.end(), args.begin(), args.end());
  return server.run(argv);
}

}  // namespace ddp::testing
