// Unit tests of the launcher's pure rules: CUDA_VISIBLE_DEVICES counting,
// --redirects/--tee syntax, endpoints, the command-line parser, where --help
// sends the reader, the one waiting helper, and what a rendezvous does with
// a value in its store that ddprun did not write, one ddprun per node under
// Slurm, the workers' error files, and the choice of a Python with torch.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "../support/located.h"
#include "../support/reserved_port.h"
#include "cli.h"
#include "error_file.h"
#include "errors.h"
#include "gpus.h"
#include "net.h"
#include "python.h"
#include "rendezvous.h"
#include "slurm_step.h"
#include "wait.h"

namespace ddprun {
namespace {

TEST(CountVisible, FollowsCudasRules) {
  EXPECT_EQ(count_visible("0,1", 4), 2);
  EXPECT_EQ(count_visible("", 4), 0);
  EXPECT_EQ(count_visible("-1", 4), 0);
  EXPECT_EQ(count_visible("1,5,2", 4), 1);  // stops at the first invalid index
  EXPECT_EQ(count_visible("0,0,1", 4), 1);  // and at a repeat
  EXPECT_EQ(count_visible(" 2 , 3", 4), 2);
  EXPECT_EQ(count_visible("GPU-8a1b,MIG-33", 4), 2);
  EXPECT_EQ(count_visible("0,1,2", 2), 1 + 1);
  EXPECT_EQ(count_visible("abc", 4), 0);
}

TEST(StdSpec, ParsesTorchrunSyntax) {
  auto all = StdSpec::parse("3", "--tee");
  EXPECT_EQ(all.of(0), 3);
  EXPECT_EQ(all.of(7), 3);
  auto map = StdSpec::parse("0:1,1:2", "--redirects");
  EXPECT_EQ(map.of(0), StdSpec::kOut);
  EXPECT_EQ(map.of(1), StdSpec::kErr);
  EXPECT_EQ(map.of(2), 0);
  EXPECT_THROW(StdSpec::parse("4", "--tee"), UsageError);
  EXPECT_THROW(StdSpec::parse("0:9", "--tee"), UsageError);
  EXPECT_THROW(StdSpec::parse("x:1", "--tee"), UsageError);
}

TEST(Endpoint, ParsesHostPortAndIpv6) {
  EXPECT_EQ(parse_endpoint("node1:1234", 29400, "e"), std::make_pair(std::string("node1"), 1234));
  EXPECT_EQ(parse_endpoint("node1", 29400, "e"), std::make_pair(std::string("node1"), 29400));
  EXPECT_EQ(parse_endpoint("[::1]:80", 29400, "e"), std::make_pair(std::string("::1"), 80));
  EXPECT_THROW(parse_endpoint("node1:0", 29400, "e"), UsageError);
  EXPECT_THROW(parse_endpoint(":80", 29400, "e"), UsageError);
}

Options parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out;
  auto o = parse_command_line(static_cast<int>(argv.size()), argv.data(), out);
  if (!o) throw std::runtime_error("help");
  return *o;
}

TEST(CommandLine, ProgramArgumentsAreNotFlags) {
  auto o = parse({"--nproc_per_node", "2", "/bin/echo", "--nproc-per-node", "9", "-r", "x"});
  EXPECT_EQ(o.nproc, 2);
  ASSERT_EQ(o.command.size(), 5u);
  EXPECT_EQ(o.command[0], "/bin/echo");
  EXPECT_EQ(o.command[2], "9");
  auto dashdash = parse({"-r3", "--", "/bin/echo", "--help"});
  EXPECT_EQ(dashdash.redirects.of(0), 3);
  EXPECT_EQ(dashdash.command.back(), "--help");
}

TEST(CommandLine, C10dAndStandaloneSettings) {
  auto c = parse({"--nnodes", "2:4", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h", "--rdzv-id", "j",
                  "--rdzv-conf", "join_timeout=7,last_call_timeout=1", "/bin/true"});
  EXPECT_EQ(c.min_nodes, 2);
  EXPECT_EQ(c.max_nodes, 4);
  EXPECT_EQ(c.endpoint_host, "h");
  EXPECT_EQ(c.endpoint_port, 29400);
  EXPECT_EQ(c.rdzv_conf.join_timeout, 7);
  EXPECT_EQ(c.rdzv_conf.last_call_timeout, 1);
  auto s = parse({"--standalone", "/bin/true"});
  EXPECT_TRUE(s.standalone);
  EXPECT_EQ(s.master_addr, "127.0.0.1");
  EXPECT_NE(s.run_id, "none");
  EXPECT_THROW(parse({"--standalone", "--nnodes", "2", "/bin/true"}), UsageError);
  EXPECT_THROW(parse({"--rdzv-backend", "c10d", "/bin/true"}), UsageError);
  // An empty flag name matched every option in Boost (fuzz/corpus/ddprun_cli_fuzz/crash-empty-option-name).
  EXPECT_THROW(parse({"--=tee", "/bin/true"}), UsageError);
}

TEST(CommandLine, NumbersAreWholeAndInRange) {
  EXPECT_EQ(parse({"--max-restarts", "+3", "/bin/true"}).max_restarts, 3);
  EXPECT_EQ(parse({"--monitor-interval", "0.5", "/bin/true"}).monitor_interval, 0.5);
  EXPECT_EQ(parse({"--term-timeout", "0", "/bin/true"}).term_timeout, 0);
  for (const char* bad : {"", " 3", "3 ", "3x", "0x10", "1e3", "99999999999"})
    EXPECT_THROW(parse({"--max-restarts", bad, "/bin/true"}), UsageError) << "'" << bad << "'";
  for (const char* bad : {"", "-1", "nan", "inf", "1s", "0x1p3"})
    EXPECT_THROW(parse({"--term-timeout", bad, "/bin/true"}), UsageError) << "'" << bad << "'";
  EXPECT_THROW(parse({"--rdzv-conf", "join_timeout=soon", "/bin/true"}), UsageError);
}

// --nproc-per-node 10000 would fork until EAGAIN: refused, with the way out.
TEST(CommandLine, NprocFarBeyondTheMachineIsRefusedUnlessAllowed) {
  EXPECT_EQ(nproc_limit(2, 0), kNprocFloor);
  EXPECT_EQ(nproc_limit(32, 8), 128);
  EXPECT_EQ(nproc_limit(4, 64), 256);
  ::unsetenv("DDPRUN_MAX_NPROC");
  auto fine = parse({"--nproc-per-node", std::to_string(kNprocFloor), "/bin/true"});
  EXPECT_NO_THROW(resolve_nproc(fine));
  EXPECT_EQ(fine.nproc, kNprocFloor);
  auto huge = parse({"--nproc-per-node", "10000", "/bin/true"});
  try {
    resolve_nproc(huge);
    ADD_FAILURE() << "10000 workers accepted";
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("--nproc-per-node 10000"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(usable_cpus()) + " usable CPUs"), std::string::npos) << what;
    EXPECT_NE(what.find("DDPRUN_MAX_NPROC=10000"), std::string::npos) << what;
  }
  ::setenv("DDPRUN_MAX_NPROC", "10000", 1);
  EXPECT_NO_THROW(resolve_nproc(huge));
  EXPECT_EQ(huge.nproc, 10000);
  ::setenv("DDPRUN_MAX_NPROC", "9999", 1);
  EXPECT_THROW(resolve_nproc(huge), UsageError);
  ::setenv("DDPRUN_MAX_NPROC", "many", 1);
  EXPECT_THROW(resolve_nproc(huge), UsageError);
  ::unsetenv("DDPRUN_MAX_NPROC");
}

TEST(CommandLine, VersionAndHelpNeedNoProgram) {
  std::ostringstream out;
  const char* argv[] = {"ddprun", "--version"};
  EXPECT_FALSE(parse_command_line(2, argv, out));
  EXPECT_EQ(out.str(), version_line() + "\n");
  EXPECT_EQ(version_line().rfind("ddprun (libddp) ", 0), 0u) << version_line();
  EXPECT_NE(version_line().find("\nbackends: gloo"), std::string::npos) << version_line();
}

TEST(Documentation, InstalledDocsBesideTheExecutableWin) {
  namespace fs = std::filesystem;
  fs::path prefix = fs::temp_directory_path() / ("ddprun_docs_" + std::to_string(::getpid()));
  fs::create_directories(prefix / "share" / "doc" / "ddp");
  std::string exe = (prefix / "bin" / "ddprun").string();
  // Nothing installed beside the build tree's ddprun: the source tree's copy.
  const std::string fallback = documentation_path(DDPRUN_BIN);
  EXPECT_TRUE(fs::is_regular_file(fallback)) << fallback;
  EXPECT_EQ(fs::path(fallback).filename(), "launcher.md");
  // Nowhere to be found: where it is, in words.
  EXPECT_EQ(documentation_path(exe), "docs/launcher.md in libddp's source (not installed beside this ddprun)");
  std::ofstream(prefix / "share" / "doc" / "ddp" / "launcher.md") << "# ddprun\n";
  EXPECT_EQ(documentation_path(exe), (prefix / "share" / "doc" / "ddp" / "launcher.md").string());
  fs::remove_all(prefix);
}

TEST(WaitUntil, ReturnsWhenTheConditionHolds) {
  int polls = 0, ticks = 0, notices = 0;
  auto start = Clock::now();
  bool ok = wait_until(start + std::chrono::seconds(30), [&] { ++ticks; }, std::chrono::milliseconds(1),
                       [&] { return ++polls == 5; }, Notice{start, [&] { ++notices; }});
  EXPECT_TRUE(ok);
  EXPECT_EQ(polls, 5);
  EXPECT_EQ(ticks, 4);    // between polls, not after the last
  EXPECT_EQ(notices, 1);  // once, however long the wait
}

TEST(WaitUntil, GivesUpAtTheDeadlineAndStopsWhenTickThrows) {
  auto start = Clock::now();
  bool notice_said = false;
  EXPECT_FALSE(wait_until(start + std::chrono::milliseconds(50), {}, std::chrono::milliseconds(5),
                          [] { return false; }, Notice{start + std::chrono::hours(1), [&] { notice_said = true; }}));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_FALSE(notice_said);  // not due yet
  int polls = 0;
  EXPECT_THROW(wait_until(start + std::chrono::hours(1), [] { throw Interrupted(SIGINT); },
                          std::chrono::milliseconds(1), [&] { return ++polls > 3; }),
               Interrupted);
  EXPECT_EQ(polls, 1);
}

// Any finite number of seconds the command line accepts is a deadline that
// does not overflow (fuzz/corpus/ddprun_cli_fuzz/crash-term-timeout-1e300).
TEST(WaitUntil, HugeSecondsSaturateAtACentury) {
  const auto century = std::chrono::hours(24 * 365 * 100);
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::hours>(ddprun::seconds(1e300)), century);
  EXPECT_EQ(ddprun::seconds(0.5), std::chrono::milliseconds(500));
  EXPECT_GT(Clock::now() + ddprun::seconds(1e300), Clock::now());
}

// Another program wrote under ddprun's keys: a one-line LaunchError that says
// which key and value, not an exception from deep inside number parsing.
TEST(StoreRendezvous, AValueDdprunDidNotWriteIsALaunchError) {
  uint16_t port = ::ddp::testing::reserved_port();
  c10d::TCPStoreOptions so;
  so.port = port;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(10);
  c10d::TCPStore server("127.0.0.1", so);
  std::string junk = "three";
  server.set("ddprun/job/round", std::vector<uint8_t>(junk.begin(), junk.end()));

  auto o = parse({"--nnodes", "2", "--node-rank", "1", "--master-port", std::to_string(port), "--rdzv-id", "job",
                  "--rdzv-conf", "join_timeout=10", "/bin/true"});
  auto rendezvous = make_rendezvous(o, [] {});
  try {
    rendezvous->join(0, 1, [] {});
    ADD_FAILURE() << "join accepted round 'three'";
  } catch (const LaunchError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("holds 'three' under ddprun/job/round"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// ------------------------------------------------ one ddprun per Slurm node

ddp::LaunchEnv::Lookup lookup_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string refusal(std::map<std::string, std::string> vars) {
  try {
    check_one_ddprun_per_node(lookup_of(std::move(vars)));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(OneDdprunPerNode, RefusesSeveralTasksOfOneStepOnThisNode) {
  std::map<std::string, std::string> step{{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}, {"SLURM_NODEID", "1"},
                                          {"SLURMD_NODENAME", "gpu07"}, {"SLURM_LOCALID", "0"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "1,2(x3)"}};
  std::string what = refusal(step);
  ASSERT_FALSE(what.empty());
  for (const char* part : {"Slurm step 77.3", "2 tasks on node 1 (gpu07)", "SLURM_STEP_TASKS_PER_NODE=1,2(x3)",
                           "srun --ntasks-per-node=1 ddprun", "without ddprun"})
    EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;

  // The same step on node 0 has one task there: fine.
  step["SLURM_NODEID"] = "0";
  EXPECT_EQ(refusal(step), "");
  // SLURM_STEPID (older Slurm) marks a step as well.
  EXPECT_NE(refusal({{"SLURM_JOB_ID", "77"}, {"SLURM_STEPID", "0"}, {"SLURM_NTASKS_PER_NODE", "4"}}), "");
  // The second task of a node knows it is one, whatever the counts say.
  std::string second = refusal({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"SLURM_LOCALID", "1"}});
  EXPECT_NE(second.find("2 tasks on node 0"), std::string::npos) << second;
  EXPECT_NE(second.find("SLURM_LOCALID=1"), std::string::npos) << second;
}

TEST(OneDdprunPerNode, AllowsOneTaskPerNodeAndLifeOutsideAStep) {
  EXPECT_EQ(refusal({}), "");
  EXPECT_EQ(refusal({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "3"},
                     {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"}, {"SLURM_NTASKS_PER_NODE", "8"}}),
            "");  // the step's count wins over the job's --ntasks-per-node
  // A batch script (no step) may see 8 tasks per node: it is not srun's task.
  EXPECT_EQ(refusal({{"SLURM_JOB_ID", "77"}, {"SLURM_NTASKS_PER_NODE", "8"}, {"SLURM_TASKS_PER_NODE", "8(x2)"}}), "");
  // A malformed count is a usage error naming the variable.
  std::string bad = refusal({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x"}});
  EXPECT_NE(bad.find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << bad;
}


// ------------------------------------------------------- workers' error files

const char* const kRecord =
    R"({"message": {"message": "ddp::CommError: rank 3: \"allreduce\" timed out\n(after 30 s) caf\u00e9 \ud83d\ude00",)"
    R"( "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\"\nRuntimeError: x",)"
    R"( "timestamp": "1700000000"}}})";

TEST(ErrorFile, ReadsTorchrunsShape) {
  auto e = parse_error_json(kRecord);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "ddp::CommError: rank 3: \"allreduce\" timed out\n(after 30 s) caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(e->traceback, "Traceback (most recent call last):\n  File \"t.py\"\nRuntimeError: x");
  EXPECT_EQ(e->timestamp, 1700000000);
  // No py_callstack: the message is the traceback (torchrun's rule); keys in any order, extra keys ignored.
  auto bare = parse_error_json(R"({"other": [1, {"a": null}], "message": {"extraInfo": {"timestamp": 12.5},)"
                               R"( "message": "std::runtime_error: boom"}})");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->traceback, "std::runtime_error: boom");
  EXPECT_EQ(bare->timestamp, 12);
  // torchrun's older shape: the message is a string, the timestamp beside it.
  auto old = parse_error_json(R"({"message": "Signal 6 (SIGABRT) received by PID 7", "timestamp": 1700000001})");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->message, "Signal 6 (SIGABRT) received by PID 7");
  EXPECT_EQ(old->timestamp, 1700000001);
}

TEST(ErrorFile, ShowsNothingForOtherShapesAndDefusesTheText) {
  for (const char* bad : {"", "null", "{}", "[]", R"({"message": 3})", R"({"message": {"extraInfo": {}}})",
                          R"({"message": {"message": ""}})", R"({"message": "x"} trailing)", R"({"message": "x",})",
                          R"({"message": "\x"})", R"({"message": "a)"
                          "\n"
                          R"(b"})"})
    EXPECT_FALSE(parse_error_json(bad)) << bad;
  // A lone surrogate is U+FFFD, the rest of the text is kept.
  auto lone = parse_error_json(R"({"message": "\ud800x\udc00"})");
  ASSERT_TRUE(lone);
  EXPECT_EQ(lone->message, "\xef\xbf\xbdx\xef\xbf\xbd");
  // Escape sequences a terminal would obey become '?'; newlines and tabs stay.
  auto ansi = parse_error_json(R"({"message": "\u001b[2Jred\u0007\ttab\nline\r"})");
  ASSERT_TRUE(ansi);
  EXPECT_EQ(ansi->message, "?[2Jred?\ttab\nline?");
  // Timestamps that are not Unix seconds are dropped, the message kept.
  auto when = parse_error_json(R"({"message": {"message": "m", "extraInfo": {"timestamp": "soon"}}})");
  ASSERT_TRUE(when);
  EXPECT_FALSE(when->timestamp);
}

// The launcher reads what a worker left: no input may crash it, hang it or
// make it allocate far beyond the input's size.
TEST(ErrorFile, SurvivesRandomTruncatedDeepAndHugeInput) {
  const std::string record = kRecord;
  for (size_t n = 0; n < record.size(); ++n) EXPECT_FALSE(parse_error_json(record.substr(0, n))) << n;
  std::mt19937 rng(12345);
  const std::string alphabet = "{}[]\":,\\u0123456789abcdefEnrtl.-+ \n\x01\xff\xc3";
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    if (i % 2) {
      // Mutations of a valid record: flip, drop or insert a few bytes.
      text = record;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
        size_t at = rng() % text.size();
        switch (rng() % 3) {
          case 0: text[at] = alphabet[rng() % alphabet.size()]; break;
          case 1: text.erase(at, 1); break;
          default: text.insert(at, 1, alphabet[rng() % alphabet.size()]);
        }
      }
    } else {
      for (size_t n = rng() % 200; n > 0; --n) text += alphabet[rng() % alphabet.size()];
    }
    auto e = parse_error_json(text);
    if (e) EXPECT_FALSE(e->message.empty());
  }
  EXPECT_FALSE(parse_error_json(std::string(1000000, '[') + std::string(1000000, ']')));
  EXPECT_FALSE(parse_error_json(std::string(1000000, '{')));
  std::string nested = R"({"message": )";
  for (int i = 0; i < 100; ++i) nested += R"({"message": )";
  EXPECT_FALSE(parse_error_json(nested + "\"x\"" + std::string(101, '}')));
  std::string many = "[";
  for (int i = 0; i < 500000; ++i) many += "{\"k\":0},";
  EXPECT_FALSE(parse_error_json(many + "0]"));
  auto huge = parse_error_json(R"({"message": ")" + std::string(4 << 20, 'x') + "\"}");
  ASSERT_TRUE(huge);
  EXPECT_LT(huge->message.size(), kMaxErrorTextBytes + 100);
  EXPECT_NE(huge->message.find("bytes cut)"), std::string::npos);
}

TEST(ErrorFile, ReadingIsBoundedAndNeverBlocks) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("ddprun_errfile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string problem = "unset";
  EXPECT_FALSE(read_error_file((dir / "missing.json").string(), &problem));
  EXPECT_EQ(problem, "");  // no file is not a problem

  std::ofstream((dir / "good.json").string()) << kRecord;
  auto good = read_error_file((dir / "good.json").string(), &problem);
  ASSERT_TRUE(good) << problem;
  EXPECT_EQ(good->timestamp, 1700000000);

  std::ofstream((dir / "garbage.json").string()) << "\x7f" "ELF\x01\x02 not json";
  EXPECT_FALSE(read_error_file((dir / "garbage.json").string(), &problem));
  EXPECT_NE(problem.find("torchrun's JSON shape"), std::string::npos) << problem;

  std::ofstream((dir / "big.json").string()) << R"({"message": ")" << std::string(kMaxErrorFileBytes, 'x') << "\"}";
  EXPECT_FALSE(read_error_file((dir / "big.json").string(), &problem));
  EXPECT_NE(problem.find("larger than"), std::string::npos) << problem;

  ASSERT_EQ(::mkfifo((dir / "fifo.json").c_str(), 0600), 0);  // nobody will ever write to it
  EXPECT_FALSE(read_error_file((dir / "fifo.json").string(), &problem));
  EXPECT_EQ(problem, "a FIFO, not a regular file");
  fs::create_directories(dir / "a_dir.json");
  EXPECT_FALSE(read_error_file((dir / "a_dir.json").string(), &problem));
  EXPECT_FALSE(problem.empty());
  fs::remove_all(dir);
}

TEST(RoundEnd, CarriesTheWorkersMessageBetweenNodes) {
  RoundEnd r = RoundEnd::failure(7, true, "rank 3 (local rank 1) on host h: exit code 7");
  r.message = "ddp::CommError: rank 3: lost\npeer";
  RoundEnd back = RoundEnd::parse(r.serialize());
  EXPECT_EQ(back.kind, RoundEnd::Kind::Failure);
  EXPECT_EQ(back.exit_code, 7);
  EXPECT_TRUE(back.restartable);
  EXPECT_EQ(back.text, r.text);
  EXPECT_EQ(back.message, r.message);
  // A record from a ddprun that sends no message.
  RoundEnd old = RoundEnd::parse("4\n0\nnode 1 is gone");
  EXPECT_EQ(old.kind, RoundEnd::Kind::Failure);
  EXPECT_FALSE(old.restartable);
  EXPECT_EQ(old.text, "node 1 is gone");
  EXPECT_EQ(old.message, "");
}

TEST(RoundEnd, AnAdmissionIsNoFailure) {
  RoundEnd back = RoundEnd::parse(RoundEnd::admission("1 node waits to join the 2 running (at most 3)").serialize());
  EXPECT_TRUE(back.admits_nodes());
  EXPECT_EQ(back.exit_code, 0);
  EXPECT_TRUE(back.restartable);
  EXPECT_EQ(back.text, "1 node waits to join the 2 running (at most 3)");
}

TEST(RoundEnd, GarbageReadsAsAFailure) {
  // Fewer than two lines, or an unknown kind: never an admission.
  for (const std::string s : {"", "\n", "x\ny\n", "\n\n\n\n", "0\nm", "99999999999999999999\nM\n"}) {
    RoundEnd r = RoundEnd::parse(s);
    EXPECT_EQ(r.kind, RoundEnd::Kind::Failure) << s;
  }
  RoundEnd r = RoundEnd::parse("abc\nq\ntext\nmessage");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(r.restartable);
  EXPECT_EQ(r.text, "text");
  EXPECT_EQ(r.message, "message");
}

// ------------------------------------------------------ a Python with torch

class PythonChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("ddprun_python_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_ + "/bin");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A fake interpreter: `-c "import torch"` runs `import_torch` (shell).
  std::string fake(const std::string& name, const std::string& import_torch) {
    std::string path = dir_ + "/bin/" + name;
    std::ofstream(path) << "#!/bin/sh\nif [ \"$1\" = -c ]; then\n" << import_torch << "\nfi\necho fake \"$@\"\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    return path;
  }
  std::string dir_;
};

const char* const kNoTorch =
    "echo 'Traceback (most recent call last):' >&2; echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1";

TEST_F(PythonChoiceTest, TakesTheFirstThatImportsTorchAndSaysWhenItIsNotTheFirst) {
  std::string without = fake("python3", kNoTorch);
  std::string with = fake("python3-torch", "exit 0");
  auto first = choose_python(dir_ + "/bin", 30, {"python3-torch", "python3"});
  EXPECT_EQ(first.path, with);
  EXPECT_EQ(first.note, "");
  auto second = choose_python(dir_ + "/bin", 30, {"python3", "/no/such/python3", with});
  EXPECT_EQ(second.path, with);
  EXPECT_NE(second.note.find(with), std::string::npos) << second.note;
  EXPECT_NE(second.note.find("python3 on PATH (" + without + "): exit code 1: ModuleNotFoundError"),
            std::string::npos)
      << second.note;
}

TEST_F(PythonChoiceTest, NoneWithTorchNamesEveryOneTried) {
  std::string without = fake("python3", kNoTorch);
  std::string slow = fake("python-slow", "exec sleep 60");
  try {
    choose_python(dir_ + "/bin", 0.5, {"python3", "/no/such/python3", "python-slow", "python"});
    ADD_FAILURE() << "an interpreter without torch was chosen";
  } catch (const LaunchError& e) {
    std::string what = e.what();
    for (const std::string part :
         {"python3 on PATH (" + without + "): exit code 1: ModuleNotFoundError: No module named 'torch'",
          std::string("/no/such/python3: not found"), "python-slow on PATH (" + slow + "): did not finish",
          std::string("python on PATH: not found"), std::string("PYTHON_EXEC=/path/to/python3")})
      EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
  }
}

TEST_F(PythonChoiceTest, TheDefaultCandidatesEndAtTheSystemPython) {
  // Only a torch-less python3 on PATH: /usr/bin/python3 is asked next.
  fake("python3", kNoTorch);
  int status = std::system(
      "/usr/bin/python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)' "
      ">/dev/null 2>&1");
  if (status != 0) GTEST_SKIP() << "/usr/bin/python3 cannot import torch on this machine";
  auto choice = choose_python(dir_ + "/bin", kPythonCheckTimeout);
  EXPECT_EQ(choice.path, "/usr/bin/python3");
  EXPECT_NE(choice.note.find("ModuleNotFoundError"), std::string::npos) << choice.note;
}

}  // namespace
}  // namespace ddprun
