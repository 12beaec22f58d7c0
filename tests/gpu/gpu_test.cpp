// GPU tests: NCCL groups, CUDA tensors through the reducer (over NCCL and
// over Gloo, on a stream of the user's, from pinned memory), SyncBatchNorm
// on CUDA against torch.nn.SyncBatchNorm, float16 autocast with the
// GradScaler's CUDA kernels against PyTorch's, ddp::dist over NCCL against
// torch.distributed's, the background checkpoint writer's side-stream
// copies. They are built where LibTorch has CUDA and skip, saying why, where
// no GPU is visible; where one is, each runs real ranks (ddp_gpu_worker) and
// checks what its comment says. The PyTorch oracle is DDP_ORACLE_PYTHON (the
// environment's, else the one configured), with a CUDA torch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../support/located.h"
#include "../support/multiprocess.h"

using namespace ddp::testing;

namespace {

#ifndef DDP_ORACLE_PYTHON
#define DDP_ORACLE_PYTHON "/usr/bin/python3"
#endif

std::string oracle_python() {
  const char* env = std::getenv("DDP_ORACLE_PYTHON");
  return env && *env ? env : DDP_ORACLE_PYTHON;
}

// Why GPU tests cannot run here, or "" when they can.
std::string no_gpu_reason() {
#ifndef DDP_WITH_CUDA
  return "this build's LibTorch has no CUDA (build against a CUDA LibTorch: docs/gpu.md)";
#else
  if (!torch::cuda::is_available()) return "no GPU is visible (torch::cuda::is_available() is false)";
  return "";
#endif
}

int gpu_count() { return static_cast<int>(torch::cuda::device_count()); }

#define SKIP_WITHOUT_GPU()                                       \
  do {                                                           \
    const std::string why = no_gpu_reason();                     \
    if (!why.empty()) GTEST_SKIP() << "needs a GPU: " << why;    \
  } while (0)

// Why the oracle cannot run PyTorch on CUDA, or "".
std::string no_cuda_oracle_reason() {
  const std::string cmd = oracle_python() + " -c 'import torch, torch.distributed, sys; "
                          "sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0)
    return oracle_python() + " has no torch with a usable GPU (set DDP_ORACLE_PYTHON to one that has)";
  return "";
}

std::string describe_ranks(const std::vector<RankResult>& results) {
  std::ostringstream s;
  for (size_t r = 0; r < results.size(); ++r)
    s << "--- rank " << r << " (exit " << results[r].exit_code << ")\n" << results[r].output << "\n";
  return s.str();
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (const auto& r : results) ASSERT_EQ(r.exit_code, 0) << describe_ranks(results);
}

std::vector<RankResult> run_worker(int world, const std::vector<std::string>& args,
                                   std::map<std::string, std::string> env = {}) {
  return run_ranks(world, DDP_GPU_WORKER, args, std::move(env), std::chrono::seconds(300));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the C++ scenario and PyTorch's, `world` ranks each, and compares
// every file pair bitwise.
void compare_with_pytorch(const std::string& scenario, const std::string& backend, int world,
                          const std::vector<std::string>& files) {
  char tmpl[] = "/tmp/ddp_gpu_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::map<std::string, std::string> env = {{"DDP_TEST_DIR", dir}};
  expect_all_ok(run_worker(world, {scenario, "--backend", backend}, env));
  const std::string python = oracle_python();
  auto py = run_ranks(world, python, {PYTORCH_GPU_ORACLE, scenario, backend, dir}, env, std::chrono::seconds(300));
  expect_all_ok(py);
  for (int r = 0; r < world; ++r) {
    for (const auto& f : files) {
      // "amp.bin" -> amp_rank0.bin, "amp_scales.txt" -> amp_rank0_scales.txt (the scripts' names).
      const size_t cut = f.find_first_of("._") == std::string::npos ? f.size() : f.find_first_of("._");
      const std::string name = f.substr(0, cut) + "_rank" + std::to_string(r) + f.substr(cut);
      const std::string mine = slurp(dir + "/cpp_" + name), theirs = slurp(dir + "/torch_" + name);
      ASSERT_FALSE(mine.empty()) << name;
      if (name.find(".txt") != std::string::npos) {
        // "<step> <scale> <stepped>" lines: the same numbers, however printed.
        std::istringstream a(mine), b(theirs);
        std::vector<double> x, y;
        for (double v; a >> v;) x.push_back(v);
        for (double v; b >> v;) y.push_back(v);
        EXPECT_EQ(x, y) << name << ":\n" << mine << "PyTorch's:\n" << theirs;
        continue;
      }
      ASSERT_EQ(mine.size(), theirs.size()) << name;
      size_t differing = 0;
      float worst = 0;
      for (size_t i = 0; i + 4 <= mine.size(); i += 4) {
        float u, v;
        std::memcpy(&u, mine.data() + i, 4);
        std::memcpy(&v, theirs.data() + i, 4);
        if (std::memcmp(&u, &v, 4) != 0) {
          ++differing;
          worst = std::max(worst, std::fabs(u - v));
        }
      }
      EXPECT_EQ(differing, 0u) << name << ": " << differing << " of " << mine.size() / 4
                               << " floats differ from PyTorch's, worst by " << worst;
    }
  }
  std::filesystem::remove_all(dir);
}

// Every visible GPU one rank of an nccl group: all-reduce, broadcast,
// all-gather, barrier and a 64 MiB all-reduce of CUDA tensors; the group's
// device is cuda:LOCAL_RANK.
// In-process recovery on NCCL (ddprun --recover-in-process, one rank: one
// GPU): its communicators aborted and a new generation's made, DDP going on
// over it bitwise (gpu_worker.cpp's recovery_nccl).
TEST(GpuRecovery, NcclCommunicatorsAbortedAndTheGroupReformed) {
  SKIP_WITHOUT_GPU();
  auto r = run_program(DDPRUN_BIN, {"--standalone", "--nproc-per-node", "1", "--recover-in-process", DDP_GPU_WORKER,
                                    "recovery_nccl"},
                       {}, std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bitwise the plain steps"), std::string::npos) << r.output;
}

TEST(GpuNccl, CollectivesOnEveryVisibleGpu) {
  SKIP_WITHOUT_GPU();
  expect_all_ok(run_worker(gpu_count(), {"nccl_collectives", "--backend", "nccl"}));
}

// DDP over nccl (one rank per GPU, at most 2): gradients equal the ranks'
// local gradients averaged, bit for bit, with tiny buckets, as bucket views
// and as copies.
TEST(GpuReducer, NcclGradientsAreTheAverageBitwise) {
  SKIP_WITHOUT_GPU();
  const int world = std::min(gpu_count(), 2);
  expect_all_ok(run_worker(world, {"reducer_gradients", "--backend", "nccl", "--as-view", "1"}));
  expect_all_ok(run_worker(world, {"reducer_gradients", "--backend", "nccl", "--as-view", "0"}));
}

// DDP over Gloo with CUDA parameters, two ranks (on one GPU when there is
// only one): Gloo's CUDA all-reduce behind the reducer, bitwise as above.
TEST(GpuReducer, GlooCarriesCudaGradientsBitwise) {
  SKIP_WITHOUT_GPU();
  expect_all_ok(run_worker(2, {"reducer_gradients", "--backend", "gloo"}));
}

// Stream ordering and pinned memory: the whole step on a stream from the
// pool (not the default one) with batches copied non-blocking from pinned
// host memory; DDP's bucket copies and collectives must follow the backward
// kernels on that stream, or the bitwise check above fails.
TEST(GpuReducer, SideStreamAndPinnedCopies) {
  SKIP_WITHOUT_GPU();
  expect_all_ok(run_worker(std::min(gpu_count(), 2),
                           {"reducer_gradients", "--backend", "nccl", "--side-stream", "1", "--pinned", "1"}));
  expect_all_ok(run_worker(2, {"reducer_gradients", "--backend", "gloo", "--side-stream", "1", "--pinned", "1"}));
}

// The background checkpoint writer with CUDA parameters and Adam state,
// one file and sharded: the state is copied to pinned host memory on a side
// stream while the next steps run, and what loads back is the state at
// save(), bit for bit. One rank over NCCL; two over Gloo (one GPU may hold
// both), so that the sharded save splits the state between them.
TEST(GpuCheckpoint, BackgroundSaveHoldsTheStateAtSave) {
  SKIP_WITHOUT_GPU();
  for (const auto& [world, backend] : std::vector<std::pair<int, std::string>>{{1, "nccl"}, {2, "gloo"}}) {
    char tmpl[] = "/tmp/ddp_gpu_ckpt_XXXXXX";
    const std::string dir = ::mkdtemp(tmpl);
    expect_all_ok(run_worker(world, {"checkpoint_async", "--backend", backend, "--dir", dir}));
    std::filesystem::remove_all(dir);
  }
}

// SyncBatchNorm on CUDA under DDP, two ranks over Gloo, 3 steps: the
// parameters, running statistics and last outputs equal torch.nn.SyncBatchNorm's
// under PyTorch's DDP bit for bit (the same CUDA kernels, in the same order).
TEST(GpuSyncBatchNorm, MatchesPyTorchCudaSyncBatchNormBitwise) {
  SKIP_WITHOUT_GPU();
  const std::string why = no_cuda_oracle_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  compare_with_pytorch("syncbn_parity", "gloo", 2, {"syncbn.bin"});
}

// float16 autocast and ddp::GradScaler's CUDA kernels
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_) under DDP
// over nccl, 10 steps with overflowing inputs at steps 3 and 4: every step's
// scale and skip, and the final parameters, equal PyTorch's autocast and
// GradScaler's, bitwise.
TEST(GpuAmp, Float16AutocastAndScalerMatchPyTorch) {
  SKIP_WITHOUT_GPU();
  const std::string why = no_cuda_oracle_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  compare_with_pytorch("amp_parity", "nccl", 1, {"amp.bin", "amp_scales.txt"});
}

// ddp::dist over NCCL, one rank per visible GPU: every case of
// tests/comm/pytorch_dist_parity.py on CUDA tensors, line for line equal to
// torch.distributed's over NCCL (what NCCL lacks, the bitwise ops, and what
// PyTorch 2.x's NCCL refuses, an all-reduce of a non-contiguous view, is
// "unsupported" on both sides). More than one rank needs as many GPUs: NCCL
// refuses two ranks on one device.
TEST(GpuDist, EveryCollectiveOverNcclAsTorchDistributed) {
  SKIP_WITHOUT_GPU();
  const std::string why = no_cuda_oracle_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const int world = gpu_count();
  char tmpl[] = "/tmp/ddp_gpu_dist_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  expect_all_ok(run_ranks(world, DIST_WORKER, {"parity"}, {{"DDP_TEST_DIR", dir}, {"DDP_TEST_BACKEND", "nccl"}},
                          std::chrono::seconds(300)));
  expect_all_ok(run_ranks(world, oracle_python(), {DIST_PARITY_SCRIPT, dir, "nccl"}, {{"DDP_TEST_DIR", dir}},
                          std::chrono::seconds(300)));
  for (int r = 0; r < world; ++r) {
    std::istringstream ours(slurp(dir + "/cpp_r" + std::to_string(r) + ".txt"));
    std::istringstream theirs(slurp(dir + "/torch_r" + std::to_string(r) + ".txt"));
    std::vector<std::string> a, b;
    for (std::string l; std::getline(ours, l);) a.push_back(l);
    for (std::string l; std::getline(theirs, l);)
      if (l.rfind("expect ", 0) != 0) b.push_back(l);
    ASSERT_FALSE(b.empty()) << "rank " << r << ": PyTorch wrote nothing";
    EXPECT_EQ(a, b) << "rank " << r;
  }
  std::filesystem::remove_all(dir);
}

// An NCCL program that returns from main without destroy_process_group()
// exits 0, and neither libddp nor PyTorch prints anything at its end (no
// warning that the group was not destroyed, no deprecated variable, no abort
// from a backend torn down after the CUDA runtime). Each rank is started by
// itself: its whole exit, every static object's destructor included.
TEST(GpuTeardown, NcclProgramReturningFromMainWithoutDestroyEndsCleanly) {
  SKIP_WITHOUT_GPU();
  const int world = std::min(gpu_count(), 2);
  auto ranks = run_ranks(world, DIST_WORKER, {"exit"}, {{"DDP_TEST_BACKEND", "nccl"}, {"DDP_TEST_EXEC_EACH_RANK", "1"}},
                         std::chrono::seconds(120));
  for (const auto& r : ranks) {
    ASSERT_EQ(r.exit_code, 0) << describe(ranks);
    EXPECT_NE(r.output.find("summed " + std::to_string(3 * world)), std::string::npos) << r.output;
    for (const char* bad : {"WARN", "Warning", "destroy_process_group", "deprecated", "terminate", "Abort"})
      EXPECT_EQ(r.output.find(bad), std::string::npos) << "'" << bad << "' in:\n" << r.output;
  }
}

// More NCCL ranks on a node than it has GPUs: refused on every rank before
// any NCCL call, naming the GPUs, the ranks and both ways out.
TEST(GpuRanks, MoreNcclRanksThanGpusAreRefusedOnEveryRank) {
  SKIP_WITHOUT_GPU();
  const int world = gpu_count() + 1;
  for (const char* backend : {"nccl", "auto"}) {
    auto ranks = run_ranks(world, DIST_WORKER, {"exit"}, {{"DDP_TEST_BACKEND", backend}}, std::chrono::seconds(120));
    for (const auto& r : ranks) {
      EXPECT_NE(r.exit_code, 0) << describe(ranks);
      for (const char* part : {"needs a GPU of its own for each rank", "--nproc-per-node gpu", "gloo backend"})
        EXPECT_NE(r.output.find(part), std::string::npos) << backend << ": '" << part << "' in:\n" << r.output;
      EXPECT_EQ(r.output.find("Duplicate GPU"), std::string::npos) << r.output;
    }
  }
}

}  // namespace
