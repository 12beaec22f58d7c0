#include "ddp/runtime/hostlist.h"
#include "ddp/errors.h"

#include <gtest/gtest.h>

using ddp::expand_hostlist;
using V = std::vector<std::string>;

TEST(Hostlist, PlainNames) { EXPECT_EQ(expand_hostlist("a,b,c"), (V{"a", "b", "c"})); }

TEST(Hostlist, RangesKeepZeroPadding) {
  EXPECT_EQ(expand_hostlist("gpu[01-03,07],cpu5"), (V{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"}));
  EXPECT_EQ(expand_hostlist("n[8-10]"), (V{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_hostlist("n[098-100]"), (V{"n098", "n099", "n100"}));
}

TEST(Hostlist, SeveralBracketsInOneName) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[1,3]"), (V{"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}));
}

TEST(Hostlist, FirstHost) { EXPECT_EQ(ddp::first_host("gpu[07-09],a"), "gpu07"); }

TEST(Hostlist, MalformedInputsAreErrors) {
  for (const char* bad : {"", "a,,b", "n[1-2", "n1-2]", "n[3-1]", "n[a-b]", "n[]", "n[[1]]", "a b"}) {
    EXPECT_THROW(expand_hostlist(bad), ddp::LaunchEnvError) << "input: '" << bad << "'";
  }
  try {
    expand_hostlist("gpu[5-2]");
    FAIL();
  } catch (const ddp::LaunchEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("gpu[5-2]"), std::string::npos) << e.what();
  }
}

// Inputs that broke the expansion, kept for the fuzzer too
// (fuzz/corpus/hostlist_fuzz/crash-*): a number past 64 bits threw
// std::out_of_range, a range ending at 2^64-1 never ended, and ranges
// multiplied into 10^12 names; each is now a LaunchEnvError.
TEST(Hostlist, HugeNumbersAndExpansionsAreErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"n[99999999999999999999]", "is too large"},
      {"n[18446744073709551615]", "is too large"},
      // 1025 x 1025 names: past the limit with small vectors (a test that
      // builds a million names moves glibc's mmap threshold for the
      // MallocTuning tests later in this process).
      {"n[0-1024][0-1024]", "expands to more than 1048576 hosts"},
      {"n[0-2000000]", "is too large (more than 1048576 hosts)"}};
  for (const auto& [bad, why] : cases) {
    try {
      expand_hostlist(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const ddp::LaunchEnvError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(expand_hostlist("n[9223372036854775806-9223372036854775807]"),
            (V{"n9223372036854775806", "n9223372036854775807"}));
}
