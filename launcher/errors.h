// The three ways the launcher stops on its own account, each with its exit
// code: a command-line mistake (2), any other launcher error (1), and a
// signal sent to ddprun itself (128 + signal, like a shell reports it).
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun {

// A mistake in the command line or in a flag's value: exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Anything else that stops the launcher itself (port in use, unreachable
// master, rendezvous refused): exit code 1.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// SIGINT/SIGTERM/SIGHUP/SIGQUIT arrived while ddprun was waiting (for a
// rendezvous, say) and had no workers to forward it to.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signo)
      : std::runtime_error("interrupted by signal " + std::to_string(signo)), signo_(signo) {}
  int signo() const { return signo_; }

 private:
  int signo_;
};

constexpr int kExitUsage = 2;
constexpr int kExitLaunch = 1;

}  // namespace ddprun
