#include "ddp/train/run_dir.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace ddp {

namespace fs = std::filesystem;

namespace {

const char* kHeaderStart = "epoch,train_loss,test_loss,";

// Runs argv in `dir` without a shell; the child's output goes to `log`. Exit status, or -1.
int run_program(const std::vector<std::string>& argv, const std::string& dir, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (std::FILE* f = std::fopen(log.c_str(), "w")) {
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
    }
    if (::chdir(dir.c_str()) != 0) ::_exit(126);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

RunDir::RunDir(std::string path, const ProcessGroup& pg, std::string metric_name)
    : path_(std::move(path)), metric_(std::move(metric_name)), writer_(pg.rank() == 0) {
  if (!writer_) return;
  std::error_code ec;
  fs::create_directories(path_, ec);
  if (ec) throw CheckpointError(rank_tag(pg) + ": cannot create the run folder " + path_ + ": " + ec.message());
  log_.open(file("log.txt"), std::ios::app);
  if (!log_) throw CheckpointError(rank_tag(pg) + ": cannot write " + file("log.txt"));
}

std::string RunDir::file(const std::string& name) const { return (fs::path(path_) / name).string(); }

void RunDir::start(int64_t completed_epochs) {
  if (!writer_) return;
  std::vector<std::string> kept;
  if (completed_epochs > 0) {
    std::ifstream in(file("metrics.csv"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line.rfind(kHeaderStart, 0) == 0) continue;
      try {
        if (std::stoll(line.substr(0, line.find(','))) <= completed_epochs) kept.push_back(line);
      } catch (const std::exception&) {
      }
    }
  }
  std::ofstream out(file("metrics.csv"), std::ios::trunc);
  out << kHeaderStart << metric_ << ",samples_per_s,epoch_s\n";
  for (auto& l : kept) out << l << "\n";
}

void RunDir::log(const std::string& text) {
  if (!writer_) return;
  std::cout << text << (text.empty() || text.back() != '\n' ? "\n" : "") << std::flush;
  log_ << text << (text.empty() || text.back() != '\n' ? "\n" : "") << std::flush;
}

void RunDir::record(const EpochMetrics& m) {
  if (!writer_) return;
  std::ofstream out(file("metrics.csv"), std::ios::app);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%lld,%.6f,%.6f,%.6f,%.1f,%.3f\n", static_cast<long long>(m.epoch), m.train_loss,
                m.test_loss, m.test_metric, m.samples_per_s, m.epoch_s);
  out << buf;
}

bool RunDir::draw_charts() {
  if (!writer_) return false;
  const std::string script = file("charts.gp");
  {
    std::ofstream gp(script, std::ios::trunc);
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

TrainState resume_or_start(const TrainOptions& opts, RunDir& run, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, ProcessGroup& pg) {
  TrainState state;
  if (!opts.resume_path().empty()) {
    state = load_checkpoint(opts.resume_path(), model, &optimizer, pg);
    run.log("resumed from " + opts.resume_path() + " after epoch " + std::to_string(state.epoch));
  }
  state.config = opts.to_config();
  run.start(state.epoch);
  return state;
}

}  // namespace ddp
