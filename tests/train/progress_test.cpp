// ddp::Progress on each kind of stdout: it redraws one line (carriage
// return, ESC[K) only on the terminal a person watches, and prints plain lines
// into a file and into the pseudo-terminal Open MPI's mpirun gives each rank
// (copied into mpirun's own stdout, often a redirected log).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "ddp/train/progress.h"

namespace {

// Forks a child whose stdout is `out_fd` (the child sets it up with `setup`
// first), which draws a 20-step bar and exits; returns its exit status.
template <class Setup>
int draw_bar_in_child(Setup setup) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = setup();
    if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0) ::_exit(3);
    ddp::Progress bar("epoch 1/1", 20, true);
    for (int i = 0; i < 20; ++i) bar.update(1.0 / (i + 1), 64);
    bar.finish();
    std::cout.flush();
    ::_exit(bar.interactive() ? 10 : 0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The master side of a new pseudo-terminal, and the path of its slave side.
int open_pty(std::string* slave) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return -1;
  *slave = ::ptsname(master);
  return master;
}

std::string drain(int master) {
  std::string out;
  char buf[4096];
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(Progress, ToAFilePrintsPlainLines) {
  char path[] = "/tmp/ddp-progress-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(draw_bar_in_child([&] { return fd; }), 0) << "redrawn into a file";
  std::string out(static_cast<size_t>(::lseek(fd, 0, SEEK_END)), '\0');
  ASSERT_EQ(::pread(fd, out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
  ::close(fd);
  ::unlink(path);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;
  EXPECT_EQ(count_lines(out), 10u) << "one line a tenth of the way, the last at the end:\n" << out;
  EXPECT_NE(out.find("step 20/20"), std::string::npos) << out;
}

// mpirun's ranks: stdout is a pseudo-terminal that is not their controlling
// terminal (they have none, or the one mpirun was started from).
TEST(Progress, ToAPseudoTerminalThatIsNotTheControllingOnePrintsPlainLines) {
  std::string slave;
  const int master = open_pty(&slave);
  ASSERT_GE(master, 0) << std::strerror(errno);
  const int code = draw_bar_in_child([&] { return ::open(slave.c_str(), O_WRONLY | O_NOCTTY); });
  const std::string out = drain(master);
  ::close(master);
  EXPECT_EQ(code, 0) << "redrawn into mpirun's pseudo-terminal:\n" << out;
  EXPECT_EQ(out.find('\r' + std::string("epoch")), std::string::npos) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;
  EXPECT_NE(out.find("step 20/20"), std::string::npos) << out;
}

// A terminal a person watches: the process's controlling terminal.
TEST(Progress, OnTheControllingTerminalRedrawsOneLine) {
  std::string slave;
  const int master = open_pty(&slave);
  ASSERT_GE(master, 0) << std::strerror(errno);
  const int code = draw_bar_in_child([&] {
    if (::setsid() < 0) return -1;
    return ::open(slave.c_str(), O_RDWR);  // a session leader's first terminal becomes its controlling one
  });
  const std::string out = drain(master);
  ::close(master);
  EXPECT_EQ(code, 10) << "not redrawn on the terminal:\n" << out;
  EXPECT_NE(out.find("\r"), std::string::npos) << out;
  EXPECT_NE(out.find("\033[K"), std::string::npos) << out;
}

TEST(Progress, TermDumbPrintsPlainLines) {
  std::string slave;
  const int master = open_pty(&slave);
  ASSERT_GE(master, 0) << std::strerror(errno);
  const int code = draw_bar_in_child([&] {
    ::setenv("TERM", "dumb", 1);
    if (::setsid() < 0) return -1;
    return ::open(slave.c_str(), O_RDWR);
  });
  const std::string out = drain(master);
  ::close(master);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find('\033'), std::string::npos) << out;
}

// A loop that reads its loss only for the lines drawn (train_epoch's, so a
// GPU's loss is not read back at every step): every tenth step to a file,
// the last line the epoch's average rate.
TEST(Progress, TheLossIsNeededOnlyForTheLinesDrawnAndTheLastLineIsTheAverage) {
  std::ostringstream out;
  ddp::Progress bar("epoch 1/1", 20, true, &out);
  int reads = 0;
  for (int i = 0; i < 20; ++i) {
    std::optional<double> loss;
    if (bar.shows_next()) {
      loss = 1.0 / (i + 1);
      ++reads;
    }
    bar.update(loss, 64);
  }
  bar.finish();
  const std::string text = out.str();
  EXPECT_EQ(reads, 10) << text;  // steps 2, 4, ..., 18 and the last
  EXPECT_EQ(count_lines(text), 10u) << text;
  EXPECT_EQ(text.find("nan"), std::string::npos) << text;
  const std::string last = text.substr(text.rfind('\n', text.size() - 2) + 1);
  EXPECT_NE(last.find("step 20/20  loss 0.0500"), std::string::npos) << last;
  EXPECT_NE(last.find("samples/s on average"), std::string::npos) << last;
  EXPECT_EQ(text.find("on average"), text.rfind("on average")) << "only the last line";
}

}  // namespace
