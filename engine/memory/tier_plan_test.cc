#include "engine/memory/tier_plan.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

// Four chunks in bf16: 2 bytes of weights and of gradients and 12 of
// optimizer states (moments and fp32 masters) a parameter; chunk 1 is the
// largest. Built in fp32, 4 bytes a parameter.
TierInput FourChunks(uint64_t host_limit, uint64_t disk_limit) {
  TierInput in;
  const uint64_t params[] = {1 << 20, 3 << 20, 1 << 20, 1 << 20};
  for (uint64_t n : params) {
    in.param_bytes.push_back(2 * n);
    in.grad_bytes.push_back(2 * n);
    in.optimizer_bytes.push_back(12 * n);
    in.construction_bytes += 4 * n;
  }
  in.masters_with_optimizer = true;
  in.host_limit_bytes = host_limit;
  in.disk_limit_bytes = disk_limit;
  return in;
}

constexpr uint64_t kMiB = 1 << 20;

TEST(TierPlanTest, EverythingStaysOnTheHostWhenItFits) {
  TierPlan plan = PlanTiers(FourChunks(0, 1ull << 40));
  ASSERT_TRUE(plan.feasible);
  for (Tier t : plan.optimizer_tier) EXPECT_EQ(t, Tier::kHost);
  EXPECT_EQ(plan.disk_bytes, 0u);
  EXPECT_EQ(plan.staging_bytes, 0u);
  // 6 M parameters x 16 bytes.
  EXPECT_EQ(plan.host_steady_bytes, 96 * kMiB);
  EXPECT_EQ(plan.host_bytes, 96 * kMiB);
}

TEST(TierPlanTest, ConstructionPeakFollowsTheChunksAsTheyFill) {
  // Everything on the host: each chunk adds 14 B a parameter and frees 4, so
  // the peak is at the end: 6 M x 14.
  TierPlan plan = PlanTiers(FourChunks(0, 0));
  // 6 M x 14 when the last chunk is filled, its 4 MiB of built values not
  // yet freed.
  EXPECT_EQ(plan.host_construction_bytes, 88 * kMiB);
  // fp32 starts its optimizer states at the first update: construction only
  // swaps built values for chunk copies of the same size.
  TierInput fp32 = FourChunks(0, 0);
  fp32.masters_with_optimizer = false;
  for (size_t c = 0; c < fp32.param_bytes.size(); ++c) fp32.param_bytes[c] *= 2;
  plan = PlanTiers(fp32);
  // Built 24 MiB; the largest chunk (12 MiB) is filled before its values go.
  EXPECT_EQ(plan.host_construction_bytes, 36 * kMiB);
}

TEST(TierPlanTest, TheStagingBuffersAreWeighedAgainstTheStatesMoved) {
  // 96 MiB on the host with every state there. Moving the largest (36 MiB)
  // costs 3 x 36 MiB of staging: the planner moves the three small states
  // instead (36 MiB out, 3 x 12 MiB of staging in).
  TierPlan plan = PlanTiers(FourChunks(96 * kMiB - 1, 1ull << 40));
  ASSERT_FALSE(plan.feasible) << "moving the small ones frees exactly what their staging takes";
  plan = PlanTiers(FourChunks(90 * kMiB, 1ull << 40));
  ASSERT_FALSE(plan.feasible) << "24 MiB + 3 x 36 MiB with all on disk; 96 MiB with the small ones";
  EXPECT_NE(plan.problem.find("memory.host_budget"), std::string::npos) << plan.problem;
  // The least the host can need is shown: 96 MiB with every state on the
  // host (the three small ones on disk need 100 MiB while the model is
  // built, all four 24 + 3 x 36 MiB).
  EXPECT_EQ(plan.host_bytes, 96 * kMiB) << plan.problem;
  EXPECT_NE(plan.problem.find("the host needs 96.00 MiB"), std::string::npos) << plan.problem;
}

TEST(TierPlanTest, ChunksOfEqualSizeMoveUntilTheHostFits) {
  // Eight equal chunks of 1 M parameters: 128 MiB on the host. Each state
  // moved saves 12 MiB, the staging costs 36 MiB once.
  TierInput in;
  for (int c = 0; c < 8; ++c) {
    in.param_bytes.push_back(2 * kMiB);
    in.grad_bytes.push_back(2 * kMiB);
    in.optimizer_bytes.push_back(12 * kMiB);
    in.construction_bytes += 4 * kMiB;
  }
  in.masters_with_optimizer = true;
  in.disk_limit_bytes = 1ull << 40;
  in.host_limit_bytes = 100 * kMiB;
  TierPlan plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  int on_disk = 0;
  for (Tier t : plan.optimizer_tier) on_disk += t == Tier::kDisk ? 1 : 0;
  // k on disk: 128 - 12k + 36 <= 100 -> k >= 5.33.
  EXPECT_EQ(on_disk, 6);
  for (int c = 0; c < 6; ++c) EXPECT_EQ(plan.optimizer_tier[static_cast<size_t>(c)], Tier::kDisk) << c;
  EXPECT_LE(plan.host_bytes, in.host_limit_bytes);
  EXPECT_EQ(plan.disk_bytes, 6 * 12 * kMiB);
  EXPECT_EQ(plan.staging_bytes, 3 * 12 * kMiB);
  EXPECT_EQ(plan.disk_read_bytes_per_step, plan.disk_bytes);
  EXPECT_EQ(plan.disk_write_bytes_per_step, plan.disk_bytes);
}

TEST(TierPlanTest, DiskFilesAreWholeBlocks) {
  // Four chunks of 60,000 bytes of states: 15 blocks each on disk.
  TierInput in;
  for (int c = 0; c < 4; ++c) {
    in.param_bytes.push_back(1000);
    in.grad_bytes.push_back(1000);
    in.optimizer_bytes.push_back(60000);
  }
  in.host_limit_bytes = 200000;
  in.disk_limit_bytes = 1 << 20;
  TierPlan plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  EXPECT_EQ(plan.disk_bytes, 4 * 61440u);
  EXPECT_EQ(plan.staging_bytes, 3 * 61440u);
  EXPECT_EQ(plan.host_bytes, 8000u + 3 * 61440u);
  EXPECT_EQ(AlignToDisk(1), kDiskAlignment);
  EXPECT_EQ(AlignToDisk(4096), 4096u);
  EXPECT_EQ(AlignToDisk(0), 0u);
}

TEST(TierPlanTest, TooSmallADiskIsNamed) {
  TierInput in;
  for (int c = 0; c < 8; ++c) {
    in.param_bytes.push_back(2 * kMiB);
    in.grad_bytes.push_back(2 * kMiB);
    in.optimizer_bytes.push_back(12 * kMiB);
  }
  in.host_limit_bytes = 100 * kMiB;
  in.disk_limit_bytes = 50 * kMiB;
  TierPlan plan = PlanTiers(in);
  ASSERT_FALSE(plan.feasible);
  EXPECT_NE(plan.problem.find("memory.disk_budget"), std::string::npos) << plan.problem;
  EXPECT_NE(plan.problem.find("the disk tier needs 72.00 MiB"), std::string::npos) << plan.problem;
}

TEST(TierPlanTest, WithoutADiskTierTheHostLimitIsFinal) {
  TierPlan plan = PlanTiers(FourChunks(50 * kMiB, 0));
  ASSERT_FALSE(plan.feasible);
  for (Tier t : plan.optimizer_tier) EXPECT_EQ(t, Tier::kHost);
  EXPECT_NE(plan.problem.find("there is no disk tier"), std::string::npos) << plan.problem;
  EXPECT_NE(plan.problem.find("memory.host_budget"), std::string::npos) << plan.problem;
}

TEST(TierPlanTest, Defaults) {
  EXPECT_EQ(DefaultHostBudgetBytes(24ull << 30, 6ull << 30), 13824ull << 20);
  EXPECT_EQ(DefaultHostBudgetBytes(1 << 20, 2 << 20), 0u);
  EXPECT_EQ(DefaultDiskBudgetBytes(100ull << 30), 90ull << 30);
}

}  // namespace
}  // namespace ferry
