#include "engine/optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(LossScalerTest, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  LossScalerOptions o;
  o.initial_scale = 1024;
  o.growth_interval = 3;
  DynamicLossScaler s(o);
  EXPECT_EQ(s.scale(), 1024);
  s.Update(true);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 512);
  s.Update(false);
  EXPECT_EQ(s.scale(), 1024) << "three clean steps in a row";
  s.Update(false);
  s.Update(true);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 512) << "an overflow restarts the count";
}

TEST(LossScalerTest, StaysWithinItsBounds) {
  LossScalerOptions o;
  o.initial_scale = 2;
  o.min_scale = 1;
  o.max_scale = 4;
  o.growth_interval = 1;
  DynamicLossScaler s(o);
  for (int i = 0; i < 5; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1);
  for (int i = 0; i < 5; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.skipped_steps(), 5);
}

}  // namespace
}  // namespace ferry
