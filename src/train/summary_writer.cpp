// ddp::SummaryWriter (ddp/train/summary_writer.h): the folders and files
// PyTorch's SummaryWriter makes, the checks of what goes in, the buffer and
// its flushing thread. The records themselves: tensorboard/summaries.cpp.
#include "ddp/train/summary_writer.h"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>

#include "ddp/errors.h"
#include "train/tensorboard/histogram.h"
#include "train/tensorboard/record_file.h"
#include "train/tensorboard/summaries.h"

namespace ddp {

namespace fs = std::filesystem;
namespace tb = tensorboard;

namespace {

// A file is written out between flushes once this much is buffered.
constexpr size_t kWriteOutBytes = 1 << 20;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  return host;
}

// events.out.tfevents.<time %010d>.<host>.<pid>.<n><suffix>, as TensorBoard's
// EventFileWriter; n counts the files this process made, from 0.
std::string event_file_name(const std::string& suffix) {
  static std::atomic<int64_t> uid{0};
  char t[32];
  std::snprintf(t, sizeof t, "%010lld", static_cast<long long>(now_seconds()));
  return "events.out.tfevents." + std::string(t) + "." + host_name() + "." + std::to_string(::getpid()) + "." +
         std::to_string(uid++) + suffix;
}

// PyTorch's default: runs/<Mon dd_HH-MM-SS>_<host>.
std::string default_log_dir() {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&t, &local);
  char stamp[64];
  std::strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", &local);
  return (fs::path("runs") / (std::string(stamp) + "_" + host_name())).string();
}

// Python's str(time.time()): the shortest digits that read back the same.
std::string python_float_text(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;  // overlong, surrogate
    i += n;
  }
  return true;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '\0') ? std::string("\\0") : std::string(1, c);
  return out + "\"";
}

// TensorBoard reads a tag as a protobuf string: it must be UTF-8, and an
// empty one names nothing it can show.
void check_tag(const std::string& tag, const char* what) {
  if (tag.empty()) throw UsageError(std::string("SummaryWriter: the ") + what + " is empty; give it a name");
  if (!valid_utf8(tag))
    throw UsageError(std::string("SummaryWriter: the ") + what + " " + quoted(tag) +
                     " is not UTF-8 text, which TensorBoard cannot read; name it in UTF-8");
}

// A name that becomes a folder of the log folder: one folder, never out of it.
void check_folder_name(const std::string& name, const char* what) {
  check_tag(name, what);
  if (name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
    throw UsageError(std::string("SummaryWriter: the ") + what + " " + quoted(name) +
                     " names a folder of the log folder: it may not be \".\" or \"..\" or hold '/' or a NUL");
}

}  // namespace

struct SummaryWriter::State {
  std::string log_dir;
  SummaryWriterOptions options;
  std::mutex mu;
  std::condition_variable wake;
  std::map<std::string, std::unique_ptr<tb::RecordFile>> files;  // by folder
  bool failed = false, closed = false;
  std::thread flusher;

  // Under mu: stops the writer, with one warning (its files close at close()).
  void fail(const std::string& what) {
    if (failed) return;
    failed = true;
    std::cerr << "warning: TensorBoard events stop here: " << what
              << "; the run goes on without them (the files written so far stay readable)" << std::endl;
  }

  // Under mu: the folder's file, made with its first records if new (the
  // purge step's too, unless it is an add_hparams folder: PyTorch's has none).
  tb::RecordFile* file(const std::string& folder, bool purge = true) {
    auto& f = files[folder];
    if (f) return f.get();
    f = std::make_unique<tb::RecordFile>(folder, event_file_name(options.filename_suffix()));
    const std::string what = f->open();
    if (!what.empty()) {
      fail(what);
      return nullptr;
    }
    f->append(tb::file_version_event({now_seconds(), 0}));
    if (const auto step = options.purge_step(); step && purge) {
      f->append(tb::file_version_event({now_seconds(), *step}, false));
      f->append(tb::session_start_event({now_seconds(), *step}));
    }
    return f.get();
  }

  void add(const std::string& folder, const std::string& event, bool purge = true) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed || closed) return;
    auto* f = file(folder, purge);
    if (!f) return;
    f->append(event);
    if (f->buffered() >= kWriteOutBytes) write_out(*f);
  }

  // Under mu.
  void write_out(tb::RecordFile& f) {
    const std::string what = f.write_out();
    if (!what.empty()) fail(what);
  }

  void write_out_all() {
    for (auto& entry : files) {
      if (failed) return;
      write_out(*entry.second);
    }
  }

  void flush_every(std::chrono::duration<double> period) {
    std::unique_lock<std::mutex> lock(mu);
    while (!closed) {
      wake.wait_for(lock, period, [&] { return closed; });
      if (!closed && !failed) write_out_all();
    }
  }
};

SummaryWriter::SummaryWriter(std::string log_dir, SummaryWriterOptions options) : s_(std::make_unique<State>()) {
  s_->log_dir = log_dir.empty() ? default_log_dir() : std::move(log_dir);
  if (!(options.flush_secs() > 0))
    throw UsageError("SummaryWriter: flush_secs must be > 0 (seconds between flushes), got " +
                     std::to_string(options.flush_secs()));
  s_->options = std::move(options);
  {
    // As PyTorch's: the file exists, with its file_version record, from the start.
    std::lock_guard<std::mutex> lock(s_->mu);
    if (auto* f = s_->file(s_->log_dir)) s_->write_out(*f);
  }
  const auto period = std::chrono::duration<double>(s_->options.flush_secs());
  s_->flusher = std::thread([state = s_.get(), period] { state->flush_every(period); });
}

SummaryWriter::~SummaryWriter() { close(); }

const std::string& SummaryWriter::log_dir() const { return s_->log_dir; }

bool SummaryWriter::failed() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->failed;
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t global_step,
                               std::optional<double> walltime) {
  check_tag(tag, "tag");
  s_->add(s_->log_dir, tb::scalar_event(tag, value, {walltime.value_or(now_seconds()), global_step}));
}

void SummaryWriter::add_scalars(const std::string& main_tag, const std::map<std::string, double>& values,
                                int64_t global_step, std::optional<double> walltime) {
  check_tag(main_tag, "main tag");
  std::string prefix = main_tag;
  for (auto& c : prefix)
    if (c == '/') c = '_';
  check_folder_name(prefix, "main tag");
  for (const auto& v : values) check_folder_name(v.first, "key");
  const double when = walltime.value_or(now_seconds());
  for (const auto& [key, value] : values)
    s_->add((fs::path(s_->log_dir) / (prefix + "_" + key)).string(),
            tb::scalar_event(main_tag, value, {when, global_step}));
}

void SummaryWriter::add_histogram(const std::string& tag, const at::Tensor& values, int64_t global_step,
                                  std::optional<double> walltime) {
  const auto flat = values.detach().to(at::kCPU, at::kDouble).contiguous().reshape({-1});
  const double* p = flat.data_ptr<double>();
  add_histogram(tag, std::vector<double>(p, p + flat.numel()), global_step, walltime);
}

void SummaryWriter::add_histogram(const std::string& tag, const std::vector<double>& values, int64_t global_step,
                                  std::optional<double> walltime) {
  check_tag(tag, "tag");
  auto made = tb::make_histogram(values, tb::default_bucket_edges());
  if (!made.what.empty())
    throw UsageError("SummaryWriter: no histogram for " + quoted(tag) + ": " + made.what);
  s_->add(s_->log_dir, tb::histogram_event(tag, made.histogram, {walltime.value_or(now_seconds()), global_step}));
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t global_step,
                             std::optional<double> walltime) {
  check_tag(tag, "tag");
  if (!valid_utf8(text)) throw UsageError("SummaryWriter: the text of " + quoted(tag) + " is not UTF-8");
  s_->add(s_->log_dir, tb::text_event(tag, text, {walltime.value_or(now_seconds()), global_step}));
}

void SummaryWriter::add_hparams(const std::map<std::string, HParamValue>& hparams,
                                const std::map<std::string, double>& metrics, const std::string& run_name,
                                int64_t global_step) {
  for (const auto& h : hparams) {
    check_tag(h.first, "hyperparameter name");
    if (const auto* s = std::get_if<std::string>(&h.second.value()))
      if (!valid_utf8(*s)) throw UsageError("SummaryWriter: the value of hyperparameter " + quoted(h.first) + " is not UTF-8");
  }
  for (const auto& m : metrics) check_tag(m.first, "metric tag");
  const std::string name = run_name.empty() ? python_float_text(now_seconds()) : run_name;
  check_folder_name(name, "run name");
  const std::string folder = (fs::path(s_->log_dir) / name).string();
  const double when = now_seconds();
  std::map<std::string, std::variant<double, std::string>> values;
  for (const auto& h : hparams) values.emplace(h.first, h.second.value());
  for (const auto& e : tb::hparams_events(values, metrics, {when, global_step})) s_->add(folder, e, false);
  for (const auto& [tag, value] : metrics) s_->add(folder, tb::scalar_event(tag, value, {when, global_step}), false);
  // As PyTorch's, whose writer for it is closed at once: the file is whole now.
  std::lock_guard<std::mutex> lock(s_->mu);
  auto it = s_->files.find(folder);
  if (it == s_->files.end()) return;
  s_->write_out(*it->second);
  s_->files.erase(folder);
}

void SummaryWriter::flush() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->failed && !s_->closed) s_->write_out_all();
}

void SummaryWriter::close() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->closed) return;
    if (!s_->failed) s_->write_out_all();
    s_->closed = true;
    s_->files.clear();
  }
  s_->wake.notify_all();
  if (s_->flusher.joinable()) s_->flusher.join();
}

}  // namespace ddp
