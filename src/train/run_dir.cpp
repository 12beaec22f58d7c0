#include "ddp/train/run_dir.h"

#include "runtime/parse_number.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
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
      const auto epoch = parse_integer(line.substr(0, line.find(',')));
      if (epoch && *epoch <= completed_epochs) kept.push_back(line);
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

}  // namespace ddp
