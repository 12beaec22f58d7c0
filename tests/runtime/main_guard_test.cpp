// guarded_main and record_error: the error file a launcher reads
// (TORCHELASTIC_ERROR_FILE) in torchrun's JSON shape, written atomically,
// and never a reason for the failing program to fail differently; and the
// atomic writer it shares with the timeline and the training kit.
#include "ddp/runtime/main_guard.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/errors.h"
#include "runtime/atomic_file.h"

namespace {

namespace fs = std::filesystem;

class ErrorFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddp_error_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    file_ = (dir_ / "error.json").string();
    ::setenv("TORCHELASTIC_ERROR_FILE", file_.c_str(), 1);
    ::setenv("RANK", "3", 1);
  }
  void TearDown() override {
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
    ::unsetenv("RANK");
    fs::remove_all(dir_);
  }
  std::string contents() const {
    std::ifstream f(file_);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // The fields as Python's json module reads them (torchrun's reader), one
  // per line with newlines escaped; empty when /usr/bin/python3 is missing.
  std::string python_fields() const {
    if (::access("/usr/bin/python3", X_OK) != 0) return "";
    std::string cmd =
        "/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=d[\"message\"]; "
        "print(ascii(m[\"message\"])); print(ascii(m[\"extraInfo\"][\"py_callstack\"])); "
        "print(int(m[\"extraInfo\"][\"timestamp\"]) > 1600000000); print(sorted(d), sorted(m), sorted(m[\"extraInfo\"]))' " +
        file_ + " 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }
  fs::path dir_;
  std::string file_;
};

TEST_F(ErrorFile, GuardedMainWritesTorchrunsShape) {
  int code = ddp::guarded_main([]() -> int { throw ddp::CommError("rank 3: allreduce timed out \"bucket 0\"\tafter 30 s"); });
  EXPECT_EQ(code, 1);
  std::string json = contents();
  EXPECT_EQ(json.rfind("{\"message\": {\"message\": \"ddp::CommError: rank 3: allreduce timed out \\\"bucket 0\\\"\\t", 0),
            0u)
      << json;
  EXPECT_FALSE(fs::exists(file_ + ".tmp." + std::to_string(::getpid())));
  std::string fields = python_fields();
  if (fields.empty()) GTEST_SKIP() << "no /usr/bin/python3 to read the file with json.load";
  EXPECT_EQ(fields,
            "'ddp::CommError: rank 3: allreduce timed out \"bucket 0\"\\tafter 30 s'\n"
            "'ddp::CommError: rank 3: allreduce timed out \"bucket 0\"\\tafter 30 s'\n"
            "True\n"
            "['message'] ['extraInfo', 'message'] ['py_callstack', 'timestamp']\n");
}

TEST_F(ErrorFile, NamesTheTypeLabelsTheRankAndEscapesAnyText) {
  // A usage error exits 2 and is recorded too; a foreign error gets this rank's label.
  EXPECT_EQ(ddp::guarded_main([]() -> int { throw ddp::UsageError("bucket_cap_mb must be > 0"); }), 2);
  EXPECT_NE(contents().find("\"ddp::UsageError: rank 3: bucket_cap_mb must be > 0\""), std::string::npos)
      << contents();
  // Non-ASCII, control characters and bytes that are not UTF-8.
  std::string text = std::string("caf\xc3\xa9 \xf0\x9f\x98\x80 bell\x07 bad\xff\xc3 end\\") +
                     "\nException raised from f at x.cpp:1 (most recent call first):\nframe #0";
  EXPECT_TRUE(ddp::record_error(std::runtime_error(text)));
  std::string json = contents();
  for (char c : json) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "byte " << int(c) << " in " << json;
  std::string fields = python_fields();
  if (fields.empty()) GTEST_SKIP() << "no /usr/bin/python3 to read the file with json.load";
  // The message drops LibTorch's C++ backtrace, the call stack keeps it.
  EXPECT_EQ(fields.substr(0, fields.find('\n')),
            "'std::runtime_error: rank 3: caf\\xe9 \\U0001f600 bell\\x07 bad\\ufffd\\ufffd end\\\\'")
      << fields;
  EXPECT_NE(fields.find("end\\\\\\nException raised from f at x.cpp:1"), std::string::npos) << fields;
}

TEST_F(ErrorFile, NothingWithoutTheVariableAndNoHarmWhenUnwritable) {
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_FALSE(ddp::record_error(std::runtime_error("x")));
  EXPECT_FALSE(fs::exists(file_));
  ::setenv("TORCHELASTIC_ERROR_FILE", (dir_ / "no" / "such" / "dir" / "error.json").c_str(), 1);
  EXPECT_FALSE(ddp::record_error(std::runtime_error("x")));
  EXPECT_EQ(ddp::guarded_main([]() -> int { throw std::runtime_error("still reported"); }), 1);
  ::setenv("TORCHELASTIC_ERROR_FILE", dir_.c_str(), 1);  // a directory
  EXPECT_FALSE(ddp::record_error(std::runtime_error("x")));
  EXPECT_TRUE(fs::is_directory(dir_));
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(dir_, ec)) << "a temporary file was left behind";
  // An existing file is replaced whole.
  ::setenv("TORCHELASTIC_ERROR_FILE", file_.c_str(), 1);
  std::ofstream(file_) << std::string(10000, 'z');
  EXPECT_TRUE(ddp::record_error(std::runtime_error("short")));
  EXPECT_EQ(contents().find('z'), std::string::npos);
}

// The one atomic writer (runtime/atomic_file.h): a temporary beside the file,
// synced and renamed; a link at either name is replaced, never written through.
TEST_F(ErrorFile, AtomicWriterNeverWritesThroughALink) {
  const std::string outside = (dir_ / "outside.txt").string();
  std::ofstream(outside) << "keep";
  const std::string target = (dir_ / "file.txt").string();
  fs::create_symlink(outside, target + ".tmp");  // planted at the temporary's name
  ddp::write_atomically(target, std::vector<char>{'n', 'e', 'w'});
  fs::create_symlink(outside, file_);  // planted at the file's own name
  const std::string tmp = file_ + ".part";
  EXPECT_FALSE(ddp::detail::write_synced_temporary(tmp, "text", 4));
  EXPECT_FALSE(ddp::detail::rename_synced(tmp, file_));
  EXPECT_FALSE(fs::is_symlink(file_));
  EXPECT_EQ(contents(), "text");
  std::ifstream in(outside), written(target);
  std::stringstream kept, text;
  kept << in.rdbuf();
  text << written.rdbuf();
  EXPECT_EQ(kept.str(), "keep");
  EXPECT_EQ(text.str(), "new");
  EXPECT_FALSE(fs::exists(target + ".tmp"));
  EXPECT_FALSE(fs::exists(tmp));
}

TEST_F(ErrorFile, AtomicWriterNamesTheStepThatFailed) {
  const std::string missing = (dir_ / "no" / "such.txt").string();
  const auto failure = ddp::detail::write_synced_temporary(missing + ".tmp", "x", 1);
  EXPECT_EQ(failure.step, "open " + missing + ".tmp");
  EXPECT_EQ(failure.err, ENOENT);
  try {
    ddp::write_atomically(missing, std::vector<char>{'x'});
    ADD_FAILURE() << "no error for a missing folder";
  } catch (const ddp::CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("writing " + missing + ": open " + missing + ".tmp failed (its folder ", 0), 0u)
        << e.what();
  }
  std::ofstream(file_ + ".tmp") << "left over";
  const auto renamed = ddp::detail::rename_synced(file_ + ".tmp", missing);
  EXPECT_EQ(renamed.step, "rename");
  EXPECT_FALSE(fs::exists(file_ + ".tmp")) << "a failed rename leaves no temporary";
}

}  // namespace
