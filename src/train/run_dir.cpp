#include "ddp/train/run_dir.h"

#include "runtime/atomic_file.h"
#include "train/run_tensorboard.h"
#include "runtime/parse_number.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

namespace ddp {

namespace fs = std::filesystem;

namespace {

const char* kHeaderStart = "epoch,train_loss,test_loss,";

}  // namespace

RunDir::RunDir(std::string path, const ProcessGroup& pg, std::string metric_name)
    : path_(std::move(path)), metric_(std::move(metric_name)), writer_(pg.rank() == 0) {
  // One line from every rank, so that a job's output says where each ran.
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  std::cout << "rank " << pg.rank() << " of " << pg.size() << " on " << host << ", pid " << ::getpid() << ", "
            << pg.backend_name() << ", run folder " << path_ << std::endl;
  if (writer_) open_folder(pg);
}

void RunDir::open_folder(const ProcessGroup& pg) {
  std::error_code ec;
  fs::create_directories(path_, ec);
  if (ec) throw CheckpointError(rank_tag(pg) + ": cannot create the run folder " + path_ + ": " + ec.message());
  try {
    log_fd_ = open_append_no_follow(file("log.txt"));
  } catch (const CheckpointError& e) {
    throw CheckpointError(rank_tag(pg) + ": " + e.what());
  }
}

void RunDir::follow(const ProcessGroup& pg, int64_t step) {
  const bool rank0 = pg.rank() == 0;
  if (rank0 == writer_) return;
  writer_ = rank0;
  if (rank0) {
    open_folder(pg);
    if (tensorboard_wanted_) open_tensorboard(step, options_);
    return;
  }
  // A rank that joined took rank 0 back (it has the lowest launch rank).
  if (tensorboard_) tensorboard_->close();
  tensorboard_.reset();
  if (log_fd_ >= 0) ::close(log_fd_);
  log_fd_ = -1;
}

RunDir::~RunDir() {
  detail::forget_open_run(this);
  if (tensorboard_) tensorboard_->close();  // flushed; the hyperparameters only at finish_run
  if (log_fd_ >= 0) ::close(log_fd_);
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
      const auto epoch = parse_integer(line.substr(0, line.find(',')));
      if (epoch && *epoch <= completed_epochs) kept.push_back(line);
    }
  }
  std::string text = kHeaderStart + metric_ + ",samples_per_s,epoch_s\n";
  for (auto& l : kept) text += l + "\n";
  write_atomically(file("metrics.csv"), std::vector<char>(text.begin(), text.end()));
}

void RunDir::log(const std::string& text) {
  if (!writer_) return;
  const std::string line = text + (text.empty() || text.back() != '\n' ? "\n" : "");
  std::cout << line << std::flush;
  if (!tensorboard_ && logged_.size() < (64u << 10)) logged_ += line;  // the "environment" text
  for (size_t done = 0; log_fd_ >= 0 && done < line.size();) {  // best effort, as a console's
    const ssize_t n = ::write(log_fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

void RunDir::record(const EpochMetrics& m) {
  if (!writer_) return;
  last_ = m;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%lld,%.6f,%.6f,%.6f,%.1f,%.3f\n", static_cast<long long>(m.epoch), m.train_loss,
                m.test_loss, m.test_metric, m.samples_per_s, m.epoch_s);
  append_no_follow(file("metrics.csv"), buf);
}

}  // namespace ddp
