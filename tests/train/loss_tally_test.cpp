// The epoch loop's loss tally (src/train/epoch_checks.h): loss x samples
// summed with the arithmetic of a sum kept on the host, bit for bit, across
// its read backs; the first step whose loss was not finite, kept until
// forgotten, then the next one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "train/epoch_checks.h"

namespace {

float step_loss(int64_t i) { return 2.3f / static_cast<float>(i + 1) + 0.013f * static_cast<float>(i); }

}  // namespace

TEST(LossTally, SumsLossTimesSamplesAsTheHostDoesAcrossReadBacks) {
  ddp::detail::LossTally tally;
  EXPECT_EQ(tally.read().sum, 0.0);
  double host = 0;
  const int64_t steps = 150;  // past what the tally keeps on the device before it reads back
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t samples = i == steps - 1 ? 17 : 256;  // the last batch is short
    tally.add(torch::full({}, step_loss(i)), samples);
    host += static_cast<double>(step_loss(i)) * static_cast<double>(samples);
    if (i == 9 || i == 100) EXPECT_EQ(tally.read().sum, host) << "after step " << i;  // a check between
  }
  const auto r = tally.read();
  EXPECT_EQ(r.sum, host);
  EXPECT_EQ(r.nonfinite, -1);
  EXPECT_EQ(tally.read().sum, host) << "a second read adds nothing";
}

TEST(LossTally, KeepsTheFirstNonFiniteStepUntilForgotten) {
  const double inf = std::numeric_limits<double>::infinity();
  ddp::detail::LossTally tally;
  for (int64_t i = 0; i < 100; ++i) {
    const double loss = i == 70 ? std::nan("") : i == 80 ? inf : step_loss(i);
    tally.add(torch::full({1}, loss, torch::kFloat), 32);  // a one-element loss is taken too
  }
  auto r = tally.read();
  EXPECT_EQ(r.nonfinite, 70);
  EXPECT_TRUE(std::isnan(r.nonfinite_loss));
  EXPECT_TRUE(std::isnan(r.sum));

  tally.forget_nonfinite();
  EXPECT_EQ(tally.read().nonfinite, -1) << "the later inf was added before the warning: forgotten with it";
  tally.add(torch::full({}, 1.0f), 32);
  tally.add(torch::full({}, -inf, torch::kFloat), 32);
  r = tally.read();
  EXPECT_EQ(r.nonfinite, 101);
  EXPECT_EQ(r.nonfinite_loss, -inf);
}
