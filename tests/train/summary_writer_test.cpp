// ddp::SummaryWriter: the TFRecord framing and CRC-32C, PyTorch's default
// histogram buckets, the tags refused, a disk that fills (RLIMIT_FSIZE in a
// child) and a link where a folder goes (the writer stops with one warning,
// the program goes on), a killed process (what was flushed stays) and the
// timed flush; then what TensorBoard itself reads from our files,
// and that they equal, record for record, the files torch 2.x's
// SummaryWriter writes with the same calls (check_tensorboard.py, one
// Python process, with the torch 2.x environment's Python: skipped, saying
// why, where it or its tensorboard is missing).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "ddp/errors.h"
#include "ddp/train/summary_writer.h"
#include "../support/located.h"
#include "python_run.h"
#include "train/tensorboard/histogram.h"
#include "train/tensorboard/record_file.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  std::string templ = (fs::temp_directory_path() / ("ddp_tb_" + name + "_XXXXXX")).string();
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  return templ;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The records of an event file whose framing and both CRCs check; stops at a
// torn or damaged one.
std::vector<std::string> records(const fs::path& p) {
  const std::string s = read_file(p);
  std::vector<std::string> out;
  size_t at = 0;
  while (at + 12 <= s.size()) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
    auto u32 = [&](size_t o) {
      uint32_t v = 0;
      for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[o + static_cast<size_t>(i)]);
      return v;
    };
    if (u32(at + 8) != ddp::tensorboard::masked_crc32c(s.data() + at, 8) || at + 12 + len + 4 > s.size()) break;
    if (u32(at + 12 + len) != ddp::tensorboard::masked_crc32c(s.data() + at + 12, len)) break;
    out.push_back(s.substr(at + 12, len));
    at += 12 + len + 4;
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The calls check_tensorboard.py makes with PyTorch's SummaryWriter (keep
// the two alike).
void write_the_calls(const fs::path& dir) {
  {
    ddp::SummaryWriter w(dir.string());
    w.add_scalar("loss", 0.5, 1);
    w.add_scalar("loss", 0.25, 2);
    w.add_scalar("weird/nan", std::nan(""), 3);
    w.add_scalar("weird/inf", std::numeric_limits<double>::infinity(), 3);
    w.add_scalar("weird/inf", -std::numeric_limits<double>::infinity(), 4);
    w.add_scalar("unicode/\xce\xbb", 1.0 / 3.0, 5);
    w.add_scalars("run/x", {{"a", 1.0}, {"b", 2.0}}, 6);
    std::vector<double> values;
    for (int i = 0; i < 200; ++i) values.push_back(static_cast<double>(i * i % 97 - 40) * 0.173);
    for (double v : {0.0, 1e-12, -1e-13, 2.5e19, 3e20, -7e20}) values.push_back(v);
    w.add_histogram("hist/values", values, 7);
    w.add_histogram("hist/tensor", torch::arange(-2.0, 2.0, 0.25), 7);
    w.add_text("notes", "# a title\nline \xce\xbb", 8);
    w.add_hparams({{"amp", true}, {"bs", 64}, {"lr", 0.1}, {"opt", "sgd"}}, {{"hparam/acc", 0.9}}, "hp", 9);
  }
  {
    ddp::SummaryWriter first((dir / "purge").string());
    for (int s = 1; s <= 3; ++s) first.add_scalar("p", s, s);
  }
  // TensorBoard reads a folder's files in the order of their names, whose
  // first part is the second they were made in: the resumed writer's file
  // must come from a later second (in the same second, the file counter
  // decides, and "10" sorts before "9"). The second is read from the clock
  // the writer names files by: time() reads a coarser one, which can still
  // say the second before while the first file is named by the next.
  const auto second = [] {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  };
  const auto made = second();
  while (second() == made) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ddp::SummaryWriter resumed((dir / "purge").string(), ddp::SummaryWriterOptions().purge_step(2));
  for (int s = 2; s <= 4; ++s) resumed.add_scalar("p", 10 * s, s);
}

// Runs body in a child (RLIMIT_FSIZE and the like stay there); its stderr
// and exit status.
std::pair<std::string, int> in_child(const fs::path& dir, const std::function<void()>& body) {
  const fs::path err = dir / "child.stderr";
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen(err.c_str(), "w", stderr);
    body();
    std::fflush(stderr);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {read_file(err), WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(SummaryWriter, Crc32cAndTheRecordFramingAreTFRecords) {
  EXPECT_EQ(ddp::tensorboard::crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  const std::string framed = ddp::tensorboard::frame_record("abc");
  ASSERT_EQ(framed.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(framed[0], 3);
  EXPECT_EQ(framed.substr(12, 3), "abc");
}

TEST(SummaryWriter, DefaultBucketsAndTheTrimmedHistogramArePyTorchs) {
  const auto& edges = ddp::tensorboard::default_bucket_edges();
  ASSERT_EQ(edges.size(), 2u * 774u + 1u);  // 1e-12 * 1.1^k < 1e20: k = 0..773
  EXPECT_EQ(edges[774], 0.0);
  EXPECT_EQ(edges[775], 1e-12);
  EXPECT_EQ(edges[773], -1e-12);
  // Two values in one bucket: that bucket, with the empty one to its left.
  const auto r = ddp::tensorboard::make_histogram({1.0, 1.0}, edges);
  ASSERT_EQ(r.what, "");
  ASSERT_EQ(r.histogram.bucket.size(), 2u);
  EXPECT_EQ(r.histogram.bucket[0], 0.0);
  EXPECT_EQ(r.histogram.bucket[1], 2.0);
  EXPECT_LE(r.histogram.bucket_limit[0], 1.0);
  EXPECT_GT(r.histogram.bucket_limit[1], 1.0);
  EXPECT_EQ(r.histogram.num, 2.0);
  EXPECT_EQ(r.histogram.sum_squares, 2.0);
  EXPECT_NE(ddp::tensorboard::make_histogram({}, edges).what, "");
  EXPECT_NE(ddp::tensorboard::make_histogram({1e21}, edges).what, "");
  EXPECT_NE(ddp::tensorboard::make_histogram({std::nan("")}, edges).what, "");
}

TEST(SummaryWriter, RefusesTagsTensorBoardCannotTakeNamingThem) {
  const auto dir = scratch("tags");
  ddp::SummaryWriter w(dir.string());
  auto refused = [&](const std::function<void()>& call, const std::string& named) {
    try {
      call();
      ADD_FAILURE() << "no UsageError for " << named;
    } catch (const ddp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  refused([&] { w.add_scalar("", 1, 1); }, "tag is empty");
  refused([&] { w.add_scalar("bad\xff", 1, 1); }, "not UTF-8");
  refused([&] { w.add_scalars("loss", {{"../out", 1.0}}, 1); }, "\"../out\"");
  refused([&] { w.add_scalars("loss", {{"", 1.0}}, 1); }, "key is empty");
  refused([&] { w.add_hparams({{"lr", 0.1}}, {{"acc", 1.0}}, ".."); }, "\"..\"");
  refused([&] { w.add_histogram("h", std::vector<double>{}, 1); }, "no values");
  w.close();
  EXPECT_FALSE(fs::exists(dir.parent_path() / "out"));
  EXPECT_FALSE(w.failed());
  fs::remove_all(dir);
}

TEST(SummaryWriter, ADiskThatFillsStopsOnlyTheWriterWithOneWarningAndKeepsWhatWasFlushed) {
  const auto dir = scratch("full");
  auto [err, status] = in_child(dir, [&] {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
    ddp::SummaryWriter w((dir / "tb").string());
    for (int s = 1; s <= 10; ++s) w.add_scalar("loss", s, s);
    w.flush();
    const rlimit small{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &small);
    for (int s = 11; s <= 2000; ++s) {
      w.add_scalar("loss", s, s);
      if (s % 100 == 0) w.flush();
    }
    w.close();
    std::fprintf(stderr, "%s\n", w.failed() ? "the program went on" : "no failure seen");
  });
  EXPECT_EQ(status, 0) << err;
  EXPECT_EQ(count(err, "warning: TensorBoard events stop here"), 1u) << err;
  EXPECT_NE(err.find("events.out.tfevents."), std::string::npos) << err;
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_NE(err.find("the program went on"), std::string::npos) << err;
  const auto files = event_files(dir / "tb");
  ASSERT_EQ(files.size(), 1u);
  const auto recs = records(files[0]);
  EXPECT_GE(recs.size(), 11u);  // the file_version record and the 10 flushed before the limit
  EXPECT_LE(fs::file_size(files[0]), 4096u);
  fs::remove_all(dir);
}

TEST(SummaryWriter, WhatWasFlushedSurvivesAKilledProcessAndTheWriterFlushesByItself) {
  const auto dir = scratch("killed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ddp::SummaryWriter w((dir / "tb").string(), ddp::SummaryWriterOptions().flush_secs(3600));
    for (int s = 1; s <= 10; ++s) w.add_scalar("loss", s, s);
    w.flush();
    for (int s = 11; s <= 15; ++s) w.add_scalar("loss", s, s);  // buffered: lost with the process
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto files = event_files(dir / "tb");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(records(files[0]).size(), 11u) << "the file_version record and the 10 flushed";

  // flush_secs: written out by the writer's thread, with no flush() called.
  ddp::SummaryWriter w((dir / "timed").string(), ddp::SummaryWriterOptions().flush_secs(0.05));
  w.add_scalar("loss", 1, 1);
  files = event_files(dir / "timed");
  ASSERT_EQ(files.size(), 1u);
  size_t seen = 0;
  for (int i = 0; i < 200 && seen < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = records(files[0]).size();
  }
  EXPECT_EQ(seen, 2u) << "not written out within 2 s at flush_secs 0.05";
  w.close();
  fs::remove_all(dir);
}

TEST(SummaryWriter, ALinkWhereAFolderGoesIsNotFollowed) {
  const auto dir = scratch("link");
  fs::create_directories(dir / "tb");
  fs::create_directories(dir / "elsewhere");
  fs::create_directory_symlink(dir / "elsewhere", dir / "tb" / "loss_train");
  auto [err, status] = in_child(dir, [&] {
    ddp::SummaryWriter w((dir / "tb").string());
    w.add_scalars("loss", {{"train", 1.0}}, 1);
    w.add_scalar("after", 1.0, 2);  // stopped: nothing more
    w.close();
  });
  EXPECT_EQ(status, 0) << err;
  EXPECT_EQ(count(err, "warning: TensorBoard events stop here"), 1u) << err;
  EXPECT_NE(err.find("loss_train"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(dir / "elsewhere"));
  fs::remove_all(dir);
}

TEST(SummaryWriter, TensorBoardReadsEveryRecordAndTheFilesEqualPyTorchsRecordForRecord) {
  std::string why;
  const std::string py = ddp::testing::tensorboard_python(why);
  if (py.empty()) GTEST_SKIP() << why;
  const auto dir = scratch("parity");
  write_the_calls(dir / "ours");
  const auto out = ddp::testing::run(py + " " + TENSORBOARD_CHECK + " writer " + (dir / "ours").string() + " " +
                                     (dir / "theirs").string());
  EXPECT_NE(out.find("check_tensorboard: writer OK"), std::string::npos) << out;
  if (!HasFailure()) fs::remove_all(dir);
}
