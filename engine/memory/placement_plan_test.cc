#include "engine/memory/placement_plan.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

// Four stages, one chunk each (100 bytes of parameters): periods F0..F3,
// B3..B0, optimizer. Activations grow through the forward and shrink
// through the backward.
PlanInput FourStages(uint64_t limit) {
  PlanInput in;
  in.limit_bytes = limit;
  in.forward_periods = 4;
  in.backward_periods = 4;
  in.param_bytes = {100, 100, 100, 100};
  in.period_chunks = {{0}, {1}, {2}, {3}, {3}, {2}, {1}, {0}, {}};
  in.non_model_bytes = {10, 20, 30, 40, 40, 30, 20, 10, 0};
  return in;
}

TEST(PlacementPlanTest, NeedsCountWhatEachClassKeepsOnTheDevice) {
  PlanInput in = FourStages(1 << 20);
  using C = ChunkClass;
  // All streamed: a forward period holds its own P; backward B3 holds P3+G3.
  std::vector<uint64_t> need = PeriodNeeds(in, {C::kStreamed, C::kStreamed, C::kStreamed, C::kStreamed});
  EXPECT_EQ(need[0], 10u + 100u);
  EXPECT_EQ(need[4], 40u + 200u);
  EXPECT_EQ(need[8], 0u) << "the host runs every update";
  // Device-homed chunk 0: P and O (300) always, G from B0 to the optimizer,
  // plus one chunk-sized temporary for the update.
  need = PeriodNeeds(in, {C::kDeviceHomed, C::kStreamed, C::kStreamed, C::kStreamed});
  EXPECT_EQ(need[1], 20u + 300u + 100u);
  EXPECT_EQ(need[7], 10u + 300u + 100u);
  EXPECT_EQ(need[8], 0u + 300u + 100u + 100u);
  // Pinned params keep P everywhere.
  need = PeriodNeeds(in, {C::kPinnedParams, C::kPinnedParams, C::kPinnedParams, C::kPinnedParams});
  EXPECT_EQ(need[8], 400u);
  EXPECT_EQ(need[4], 40u + 400u + 100u);
}

// A tied chunk (an embedding and its output layer): used by the first
// stage and the last, so by the first backward period and the last. Its
// gradient can wait on the host between them; the plan sends it there only
// where the step does not fit otherwise, and counts the copies.
TEST(PlacementPlanTest, AGradientWaitsOnTheHostBetweenItsUsesOnlyWhereNeeded) {
  PlanInput in = FourStages(1 << 20);
  in.param_bytes = {300, 100, 100};
  in.period_chunks = {{0}, {1}, {2}, {0}, {0}, {2}, {1}, {0}, {}};
  in.non_model_bytes = {10, 20, 200, 10, 10, 200, 20, 10, 0};
  using C = ChunkClass;
  const std::vector<ChunkClass> streamed = {C::kStreamed, C::kStreamed, C::kStreamed};
  const std::vector<bool> release0 = {true, false, false};
  EXPECT_EQ(GradientsWithGaps(in), release0);
  // Held, G0 (300) stays from B3 to B0: B2 holds it beside P2 and G2.
  std::vector<uint64_t> need = PeriodNeeds(in, streamed);
  EXPECT_EQ(need[5], 200u + 200u + 300u);
  // Released, B2 and B1 hold only their own chunk's; B3 and B0 compute with
  // chunk 0 and hold it all.
  need = PeriodNeeds(in, streamed, release0);
  EXPECT_EQ(need[5], 200u + 200u);
  EXPECT_EQ(need[6], 20u + 200u);
  EXPECT_EQ(need[4], 10u + 600u);
  EXPECT_EQ(need[7], 10u + 600u);
  EXPECT_EQ(PlannedTraffic(in, streamed, release0), PlannedTraffic(in, streamed) + 2 * 300u) << "out and back";

  // With room, nothing is released.
  Plan plan = PlanAuto(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.grads_released, (std::vector<bool>{false, false, false}));
  // At 650 the step fits only with G0 released.
  in.limit_bytes = 650;
  EXPECT_FALSE(EvaluatePlan(in, streamed).feasible);
  plan = PlanAuto(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.grads_released, release0);
  EXPECT_EQ(plan.need_bytes[5], 400u);
  // At 600 nothing fits: the least plan's binding period is B3's 610.
  in.limit_bytes = 600;
  EXPECT_FALSE(PlanAuto(in).feasible);
  const Plan least = PlanLeast(in);
  EXPECT_FALSE(least.feasible);
  EXPECT_EQ(least.binding_need(), 610u);
}

// Gradient accumulation: a device-homed chunk's gradients stay on the device
// through the later micro-batches' forward periods; a streamed chunk's go
// to the host after each micro-batch's backward, as without it.
TEST(PlacementPlanTest, AccumulationKeepsHomedGradientsThroughTheForward) {
  PlanInput in = FourStages(1 << 20);
  in.accumulates = true;
  using C = ChunkClass;
  std::vector<uint64_t> need = PeriodNeeds(in, {C::kDeviceHomed, C::kStreamed, C::kStreamed, C::kStreamed});
  EXPECT_EQ(need[1], 20u + 300u + 100u + 100u) << "G0 too";
  EXPECT_EQ(need[7], 10u + 300u + 100u);
  need = PeriodNeeds(in, {C::kStreamed, C::kStreamed, C::kStreamed, C::kStreamed});
  EXPECT_EQ(need[0], 10u + 100u);
}

TEST(PlacementPlanTest, MixedPrecisionHomingCountsItsOptimizerStatesAndTemporaries) {
  // bf16: 100 bytes of weights and of gradients, 600 of optimizer states
  // (two fp32 moments and the fp32 master), and an update on the device
  // allocating 400 (fp32 gradients and the denominator).
  PlanInput in = FourStages(1 << 20);
  in.grad_bytes = {100, 100, 100, 100};
  in.optimizer_bytes = {600, 600, 600, 600};
  in.update_temp_bytes = {400, 400, 400, 400};
  using C = ChunkClass;
  std::vector<uint64_t> need = PeriodNeeds(in, {C::kDeviceHomed, C::kStreamed, C::kStreamed, C::kStreamed});
  EXPECT_EQ(need[1], 20u + 100u + 600u + 100u) << "P0 and O0, and P1 for its forward";
  EXPECT_EQ(need[8], 100u + 600u + 100u + 400u);
  // Homing chunk 0 fits 540 bytes when its states are fp32's 2 x P
  // (B3 holds P0, O0, P3 and G3), not when they are six times its weights;
  // so auto homes nothing there.
  const std::vector<ChunkClass> home0 = {C::kDeviceHomed, C::kStreamed, C::kStreamed, C::kStreamed};
  PlanInput fp32 = FourStages(540);
  EXPECT_TRUE(EvaluatePlan(fp32, home0).feasible);
  in.limit_bytes = 540;
  EXPECT_FALSE(EvaluatePlan(in, home0).feasible);
  Plan plan = PlanAuto(in);
  ASSERT_TRUE(plan.feasible);
  for (ChunkClass c : plan.classes) EXPECT_NE(c, C::kDeviceHomed);
}

TEST(PlacementPlanTest, TrafficIsTwelveEightOrZeroBytesPerFourOfParameters) {
  PlanInput in = FourStages(1 << 20);
  using C = ChunkClass;
  EXPECT_EQ(PlannedTraffic(in, {C::kStreamed, C::kPinnedParams, C::kDeviceHomed, C::kDeviceHomed}),
            300u + 200u);
}

TEST(PlacementPlanTest, AutoHomesEverythingOnAnAmpleDevice) {
  Plan plan = PlanAuto(FourStages(1 << 20));
  ASSERT_TRUE(plan.feasible);
  for (ChunkClass c : plan.classes) EXPECT_EQ(c, ChunkClass::kDeviceHomed);
  EXPECT_EQ(plan.traffic_bytes, 0u);
}

TEST(PlacementPlanTest, AutoNeverPlansMoreTrafficThanStaticWhereStaticFits) {
  for (uint64_t limit = 200; limit <= 2000; limit += 25) {
    PlanInput in = FourStages(limit);
    Plan zero_offload = PlanStatic(in, 0.0, 1.0);
    Plan automatic = PlanAuto(in);
    if (zero_offload.feasible) {
      ASSERT_TRUE(automatic.feasible) << limit;
      EXPECT_LE(automatic.traffic_bytes, zero_offload.traffic_bytes) << limit;
    }
    if (automatic.feasible) {
      EXPECT_LE(automatic.binding_need(), limit);
    }
  }
}

TEST(PlacementPlanTest, AutoFitsWhereZeroOffloadDoesNot) {
  // 400 bytes of parameters cannot all stay pinned next to 40 of activations
  // and a live gradient in 450 bytes, but streamed chunks fit.
  PlanInput in = FourStages(450);
  EXPECT_FALSE(PlanStatic(in, 0.0, 1.0).feasible);
  Plan plan = PlanAuto(in);
  ASSERT_TRUE(plan.feasible);
  EXPECT_NE(plan.classes[0], ChunkClass::kDeviceHomed);
}

TEST(PlacementPlanTest, InfeasibleEvenStreamedNamesTheBindingPeriod) {
  PlanInput in = FourStages(200);  // B3 needs 40 + P3 + G3 = 240
  Plan plan = PlanAuto(in);
  EXPECT_FALSE(plan.feasible);
  EXPECT_EQ(plan.binding_period, 4);
  EXPECT_EQ(plan.need_bytes[4], 240u);
}

TEST(PlacementPlanTest, StaticFractionsPickTheChunks) {
  Plan plan = PlanStatic(FourStages(1 << 20), /*param_host_fraction=*/0.5, /*optimizer_host_fraction=*/0.75);
  ASSERT_EQ(plan.classes.size(), 4u);
  EXPECT_EQ(plan.classes[0], ChunkClass::kDeviceHomed);
  EXPECT_EQ(plan.classes[1], ChunkClass::kPinnedParams);
  EXPECT_EQ(plan.classes[2], ChunkClass::kStreamed);
  EXPECT_EQ(plan.classes[3], ChunkClass::kStreamed);
}

}  // namespace
}  // namespace ferry
