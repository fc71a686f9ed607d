#include "engine/train/lr_schedule.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(LrScheduleTest, WarmsUpLinearlyThenDecaysToMin) {
  TrainOptions o;
  o.steps = 110;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(LearningRate(0, o), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(4, o), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(10, o), 1.0);
  EXPECT_NEAR(LearningRate(109, o), 0.1, 1e-12);
  // Halfway through the decay the cosine is at its midpoint.
  const double mid = LearningRate(10 + 99 / 2, o);
  EXPECT_GT(mid, 0.5);
  EXPECT_LT(mid, 0.6);
  for (int64_t s = 11; s < 110; ++s) EXPECT_LE(LearningRate(s, o), LearningRate(s - 1, o));
}

TEST(LrScheduleTest, NoWarmupStartsAtPeak) {
  TrainOptions o;
  o.steps = 10;
  o.lr = 2.0;
  o.min_lr = 0.0;
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRate(0, o), 2.0);
  EXPECT_NEAR(LearningRate(9, o), 0.0, 1e-12);
}

}  // namespace
}  // namespace ferry
