// ddp::fix_malloc_thresholds and ddp::retain_step_memory: what they set, what
// they leave to the user, and the glibc behaviour they exist for. Each case runs in a forked child, since
// malloc's settings (and the function's once-per-process latch) are global.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "ddp/runtime/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// AddressSanitizer (the sanitized CI build, DDP_SANITIZE) replaces glibc's
// malloc with its own allocator: mallopt's thresholds, trimming and the
// heap's reuse that these tests pin down do not exist there, so they skip
// and say why.
#if defined(__SANITIZE_ADDRESS__)
#define DDP_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DDP_UNDER_ASAN 1
#endif
#endif
#ifdef DDP_UNDER_ASAN
#define SKIP_UNDER_ASAN() \
  GTEST_SKIP() << "built with AddressSanitizer, which replaces glibc's malloc that these tests tune"
#else
#define SKIP_UNDER_ASAN() (void)0
#endif

namespace {

// Runs `body` in a child; its return value is the child's exit status.
int in_child(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 1;
    try {
      rc = body();
    } catch (...) {
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void clear_malloc_env() {
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                        "GLIBC_TUNABLES"})
    ::unsetenv(v);
}

#if defined(__GLIBC__)
struct Heap {
  std::size_t mmapped;  // bytes in mmap()ed blocks
  std::size_t free;     // free bytes inside the heap, which malloc reuses before mapping
};

Heap heap() {
#if __GLIBC_PREREQ(2, 33)
  const auto m = mallinfo2();
#else
  const auto m = mallinfo();
#endif
  return {static_cast<std::size_t>(m.hblkhd), static_cast<std::size_t>(m.fordblks)};
}

constexpr int kCannotTell = 77;

// Whether a block of `bytes`, allocated after one of the same size was
// freed, is mmap()ed (so that freeing it returns it to the system); or
// kCannotTell when the heap already has that much free, since malloc then
// reuses it whatever the threshold.
int second_block_is_mmapped(std::size_t bytes) {
  if (heap().free >= bytes) return kCannotTell;
  void* first = std::malloc(bytes);
  static_cast<volatile char*>(first)[0] = 1;
  std::free(first);
  const auto before = heap().mmapped;
  void* second = std::malloc(bytes);
  static_cast<volatile char*>(second)[0] = 1;
  const bool mmapped = heap().mmapped >= before + bytes;
  std::free(second);
  return mmapped ? 1 : 0;
}

// Page faults per "step" after the first: each step allocates `blocks`
// blocks of 1 MiB, writes every page, and frees them all, as a training step
// does with its activations.
long faults_per_step(int blocks) {
  auto faults = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<long>(ru.ru_minflt);
  };
  auto step = [&] {
    std::vector<void*> held;
    for (int i = 0; i < blocks; ++i) {
      held.push_back(std::malloc(1u << 20));
      std::memset(held.back(), 1, 1u << 20);
    }
    for (void* p : held) std::free(p);
  };
  step();
  step();
  const long before = faults();
  constexpr int kSteps = 4;
  for (int i = 0; i < kSteps; ++i) step();
  return (faults() - before) / kSteps;
}
#endif

}  // namespace

TEST(MallocTuning, UserSettingsInTheEnvironmentWin) {
  SKIP_UNDER_ASAN();
  EXPECT_EQ(in_child([] {
              clear_malloc_env();
              if (!ddp::malloc_settings_chosen_by_user().empty()) return 2;
              ::setenv("GLIBC_TUNABLES", "glibc.rtld.nns=2", 1);  // not a malloc tunable
              if (!ddp::malloc_settings_chosen_by_user().empty()) return 3;
              ::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0", 1);
              if (ddp::malloc_settings_chosen_by_user() != "GLIBC_TUNABLES") return 4;
              ::setenv("MALLOC_TRIM_THRESHOLD_", "65536", 1);
              auto t = ddp::fix_malloc_thresholds(4.0);
              if (t.applied || t.reason.find("MALLOC_TRIM_THRESHOLD_") == std::string::npos) return 5;
              return 0;
            }),
            0);
}

TEST(MallocTuning, ZeroOrNegativeIsNotARequestAndDoesNotLatch) {
  SKIP_UNDER_ASAN();
  EXPECT_EQ(in_child([] {
              clear_malloc_env();
              if (ddp::fix_malloc_thresholds(0).applied || ddp::fix_malloc_thresholds(-1).applied) return 2;
#if defined(__GLIBC__)
              auto t = ddp::fix_malloc_thresholds(2.0);
              if (!t.applied || t.mmap_threshold != 2u << 20 || t.trim_threshold != 4u << 20) return 3;
              // Latched: a later, different request reports the first.
              if (ddp::fix_malloc_thresholds(8.0).mmap_threshold != 2u << 20) return 4;
#endif
              return 0;
            }),
            0);
}

TEST(MallocTuning, FreedLargeBlocksKeepGoingBackToTheSystem) {
  SKIP_UNDER_ASAN();
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc: there is no dynamic mmap threshold to fix";
#else
  const std::string chosen = ddp::malloc_settings_chosen_by_user();
  if (!chosen.empty()) GTEST_SKIP() << "this process's malloc was configured through " << chosen;
  constexpr std::size_t kBlock = 24u << 20;  // under glibc's 32 MiB ceiling for the dynamic threshold
  // glibc's default: freeing an mmap()ed block raises the threshold to its
  // size, so the next such block comes from the heap and stays resident.
  const int by_default = in_child([] { return second_block_is_mmapped(kBlock); });
  if (by_default == kCannotTell) GTEST_SKIP() << "the heap already had 24 MiB free";
  EXPECT_EQ(by_default, 0) << "glibc no longer raises its mmap threshold on free; ddp/runtime/malloc_tuning.h's reason is gone";
  // With the thresholds fixed at 2 MiB, it is mmap()ed every time.
  const int fixed = in_child([] {
    if (!ddp::fix_malloc_thresholds(2.0).applied) return 2;
    return second_block_is_mmapped(kBlock);
  });
  if (fixed == kCannotTell) GTEST_SKIP() << "the heap already had 24 MiB free";
  EXPECT_EQ(fixed, 1);
#endif
}

TEST(MallocTuning, RetainStepMemoryKeepsAStepInTheHeap) {
  SKIP_UNDER_ASAN();
#if !defined(__GLIBC__)
  GTEST_SKIP() << "not glibc: retain_step_memory() does nothing";
#else
  const std::string chosen = ddp::malloc_settings_chosen_by_user();
  if (!chosen.empty()) GTEST_SKIP() << "this process's malloc was configured through " << chosen;
  constexpr int kBlocks = 8;  // 8 MiB a step, 2,048 pages
  // glibc's default: the freed step leaves the heap's top above the trim
  // threshold (twice the largest freed block), so each step faults it in.
  const int by_default = in_child([] { return faults_per_step(kBlocks) > 1000 ? 0 : 1; });
  EXPECT_EQ(by_default, 0) << "glibc no longer returns a freed step's heap; ddp/runtime/malloc_tuning.h's reason is gone";
  const int retained = in_child([] {
    const auto r = ddp::retain_step_memory(std::size_t{kBlocks} << 20);
    if (!r.applied || r.threshold < (std::size_t{31} << 20)) return 2;
    return faults_per_step(kBlocks) < 100 ? 0 : 3;
  });
  EXPECT_EQ(retained, 0);
#endif
}

TEST(MallocTuning, RetainStepMemoryLeavesWhatItCannotOrMustNotChange) {
  SKIP_UNDER_ASAN();
  EXPECT_EQ(in_child([] {
              clear_malloc_env();
#if defined(__GLIBC__)
              auto big = ddp::retain_step_memory(std::size_t{40} << 20);
              if (big.applied || big.reason.find("32 MiB") == std::string::npos) return 2;
              ::setenv("MALLOC_TOP_PAD_", "0", 1);
              auto user = ddp::retain_step_memory(std::size_t{4} << 20);
              if (user.applied || user.reason.find("MALLOC_TOP_PAD_") == std::string::npos) return 3;
              ::unsetenv("MALLOC_TOP_PAD_");
              if (!ddp::fix_malloc_thresholds(2.0).applied) return 4;
              auto fixed = ddp::retain_step_memory(std::size_t{4} << 20);
              if (fixed.applied || fixed.reason.find("fixed") == std::string::npos) return 5;
#else
              if (ddp::retain_step_memory(std::size_t{4} << 20).applied) return 6;
#endif
              return 0;
            }),
            0);
}
