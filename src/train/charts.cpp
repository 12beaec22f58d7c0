// RunDir::draw_charts: gnuplot run on the run folder's metrics.csv. The
// process has Gloo's threads by now, so the child is made with posix_spawnp
// from arguments prepared beforehand: nothing allocates between fork and exec.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <sstream>
#include <vector>

#include "runtime/atomic_file.h"
#include "ddp/train/run_dir.h"

extern char** environ;

namespace ddp {

namespace fs = std::filesystem;

namespace {

// Runs argv in `dir` without a shell, its stdout and stderr to `log`.
// Returns the exit status, 127 if the program was not found, -1 otherwise.
int run_program(const std::vector<std::string>& argv, const std::string& dir, const std::string& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  if (posix_spawn_file_actions_init(&actions) != 0) return -1;
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT) return 127;
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

bool RunDir::draw_charts() {
  if (!writer_) return false;
  const std::string script = file("charts.gp");
  std::ostringstream gp;
  // Paths relative to the run folder, so the script redraws wherever the folder goes.
  gp << "# Draws this run's charts from metrics.csv: cd <run-dir> && gnuplot charts.gp\n"
     << "set datafile separator ','\n"
     << "set terminal pngcairo size 800,500 noenhanced\n"
     << "set key autotitle columnhead\n"
     << "set grid\n"
     << "set xlabel 'epoch'\n"
     << "set output 'loss.png'\n"
     << "set title 'loss'\n"
     << "plot 'metrics.csv' using 1:2 with linespoints title 'train', '' using 1:3 with linespoints title 'test'\n"
     << "set output '" << metric_ << ".png'\n"
     << "set title '" << metric_ << "'\n"
     << "plot 'metrics.csv' using 1:4 with linespoints title '" << metric_ << "'\n"
     << "set output 'throughput.png'\n"
     << "set title 'training throughput'\n"
     << "set ylabel 'samples/s'\n"
     << "plot 'metrics.csv' using 1:5 with linespoints title 'samples/s'\n";
  const std::string text = gp.str();
  try {
    write_atomically(script, std::vector<char>(text.begin(), text.end()));
    // gnuplot opens its outputs itself: whatever stands at their names (a
    // planted link, say) goes first, so that it creates fresh files.
    const std::vector<std::string> outputs{"loss.png", metric_ + ".png", "throughput.png", "charts.log"};
    for (const auto& name : outputs) ::unlink(file(name).c_str());
  } catch (const CheckpointError& e) {
    log(std::string("notice: no charts drawn: ") + e.what());
    return false;
  }
  const std::string out = file("charts.log");
  // gnuplot resolves the relative paths against its working directory: run it there.
  const int rc = run_program({"gnuplot", "charts.gp"}, path_, fs::absolute(out).string());
  if (rc != 0) {
    log(rc == 127 ? "notice: gnuplot not found, no charts drawn (apt-get install gnuplot-nox); metrics.csv has the numbers"
                  : "notice: gnuplot failed (see " + out + "); metrics.csv has the numbers");
    return false;
  }
  log("charts: " + file("loss.png") + ", " + file(metric_ + ".png") + ", " + file("throughput.png"));
  return true;
}

}  // namespace ddp
