#include "engine/memory/tier_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr int64_t kM = 1 << 20;

// Chunks in bf16: 2 bytes of weights and of gradients and 12 of optimizer
// states (moments and fp32 masters) an element.
TierInput Bf16(const std::vector<int64_t>& elements, uint64_t host_limit, uint64_t disk_limit) {
  TierInput in = ChunkTierInput(elements, /*mixed_precision=*/true);
  in.host_limit_bytes = host_limit;
  in.disk_limit_bytes = disk_limit;
  return in;
}

// Four chunks, chunk 1 the largest, built in fp32 (4 bytes a parameter).
TierInput FourChunks(uint64_t host_limit, uint64_t disk_limit) {
  TierInput in = Bf16({1 * kM, 3 * kM, 1 * kM, 1 * kM}, host_limit, disk_limit);
  in.built_bytes = 4 * 6 * kMiB;
  return in;
}

TEST(TierPlanTest, ChunkTierInputCountsBytesAnElement) {
  TierInput fp32 = ChunkTierInput({10, 20}, false);
  EXPECT_EQ(fp32.param_bytes(1), 80u);
  EXPECT_EQ(fp32.grad_bytes(1), 80u);
  EXPECT_EQ(fp32.optimizer_bytes(1), 160u) << "two fp32 moments";
  TierInput bf16 = ChunkTierInput({10, 20}, true);
  EXPECT_EQ(bf16.param_bytes(1), 40u);
  EXPECT_EQ(bf16.optimizer_bytes(1), 240u) << "two moments and the fp32 masters";
  EXPECT_TRUE(bf16.masters_with_optimizer);
}

TEST(TierPlanTest, EverythingStaysOnTheHostWhenItFits) {
  TierPlan plan = PlanTiers(FourChunks(0, 1ull << 40));
  ASSERT_TRUE(plan.feasible);
  for (Tier t : plan.optimizer_tier) EXPECT_EQ(t, Tier::kHost);
  for (Tier t : plan.grad_tier) EXPECT_EQ(t, Tier::kHost);
  EXPECT_EQ(plan.disk_bytes, 0u);
  EXPECT_EQ(plan.staging_bytes, 0u);
  EXPECT_EQ(plan.slot_bytes, 0u);
  // 6 M parameters x 16 bytes.
  EXPECT_EQ(plan.host_steady_bytes, 96 * kMiB);
  EXPECT_EQ(plan.host_bytes, 96 * kMiB);
}

TEST(TierPlanTest, ConstructionPeakFollowsTheChunksAsTheyFill) {
  // Everything on the host: each chunk adds 14 B a parameter and frees the
  // 4 it was built in: 6 M x 14 when the last chunk is filled, its 4 MiB of
  // built values not yet freed.
  TierPlan plan = PlanTiers(FourChunks(0, 0));
  EXPECT_EQ(plan.host_construction_bytes, 88 * kMiB);
  // Drawn straight into the chunks instead: the draw's scratch is held to
  // the end (14 x 6 + 10 MiB).
  TierInput drawn = FourChunks(0, 0);
  drawn.built_bytes = 0;
  drawn.init_scratch_bytes = 10 * kMiB;
  EXPECT_EQ(PlanTiers(drawn).host_construction_bytes, 94 * kMiB);
  // fp32 starts its optimizer states at the first update: construction only
  // swaps built values for chunk copies of the same size.
  TierInput fp32 = ChunkTierInput({1 * kM, 3 * kM, 1 * kM, 1 * kM}, false);
  fp32.built_bytes = 24 * kMiB;
  plan = PlanTiers(fp32);
  // Built 24 MiB; the largest chunk (12 MiB) is filled before its values go.
  EXPECT_EQ(plan.host_construction_bytes, 36 * kMiB);
}

TEST(TierPlanTest, GradientsGoToDiskBeforeOptimizerStates) {
  // Eight chunks of 16 M parameters: 256 MiB each on the host, 2 GiB in
  // all. A gradient on disk frees 32 MiB; the four staging slots cost four
  // slices. With 32 MiB slices that takes every gradient and a chunk's
  // states (640 MiB of exposed disk traffic), with 8 MiB six gradients
  // (192), with 2 MiB five (160, in 80 requests of 1 MiB: 10 MiB more): the
  // small slots win; 1 MiB would take five too, in twice the requests.
  TierInput in = Bf16(std::vector<int64_t>(8, 16 * kM), 1900 * kMiB, 1ull << 40);
  TierPlan plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  EXPECT_EQ(plan.grad_chunks_on_disk(), 5);
  EXPECT_EQ(plan.optimizer_chunks_on_disk(), 0);
  EXPECT_EQ(plan.slot_bytes, 2 * kMiB);
  EXPECT_EQ(plan.staging_bytes, kDiskStagingSlots * 2 * kMiB);
  EXPECT_EQ(plan.host_steady_bytes, (2048 - 5 * 32 + 8) * kMiB);
  EXPECT_EQ(plan.disk_grad_bytes, 5 * 32 * kMiB);
  EXPECT_EQ(plan.disk_optimizer_bytes, 0u);
  EXPECT_EQ(plan.disk_read_bytes_per_step, plan.disk_bytes);
  EXPECT_EQ(plan.disk_write_bytes_per_step, plan.disk_bytes);
  // A gradient's slice is its chunk's, up to the slot.
  for (size_t c = 0; c < 8; ++c) {
    EXPECT_EQ(plan.slice_elements[c], plan.grad_tier[c] == Tier::kDisk ? kM : 0) << c;
  }

  // Tighter: every gradient, then optimizer states. With 16 MiB slices two
  // chunks' states are enough (2048 - 256 - 384 + 64 = 1472 MiB); 32 MiB
  // slices would take three, and smaller ones no fewer, in more requests.
  in.host_limit_bytes = 1500 * kMiB;
  plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  EXPECT_EQ(plan.grad_chunks_on_disk(), 8);
  EXPECT_EQ(plan.optimizer_chunks_on_disk(), 2);
  EXPECT_EQ(plan.slot_bytes, 16 * kMiB);
  EXPECT_EQ(plan.host_steady_bytes, 1472 * kMiB);
  EXPECT_EQ(plan.disk_bytes, 8 * 32 * kMiB + 2 * 192 * kMiB);
  // The states' chunks go through in slices of 14 bytes an element (a
  // whole number of quanta within the slot), the others' gradients whole.
  const int64_t slice = static_cast<int64_t>(16 * kMiB / (14 * kDiskSliceQuantum)) * kDiskSliceQuantum;
  for (size_t c = 0; c < 8; ++c) {
    EXPECT_EQ(plan.slice_elements[c], plan.optimizer_tier[c] == Tier::kDisk ? slice : 8 * kM) << c;
  }
}

TEST(TierPlanTest, WithAccumulationOptimizerStatesGoToDiskBeforeGradients) {
  // The eight chunks above (2 GiB on the host), a step of 8 micro-batches:
  // a gradient on disk would be written and read back after every
  // micro-batch (15 moves the step waits for against the states' 2), so
  // the states go first: one chunk's 192 MiB frees enough at 1900 MiB.
  TierInput in = Bf16(std::vector<int64_t>(8, 16 * kM), 1900 * kMiB, 1ull << 40);
  in.micro_batches = 8;
  TierPlan plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  EXPECT_EQ(plan.grad_chunks_on_disk(), 0);
  EXPECT_EQ(plan.optimizer_chunks_on_disk(), 1);
  EXPECT_EQ(plan.disk_read_bytes_per_step, 192 * kMiB);
  EXPECT_EQ(plan.disk_write_bytes_per_step, 192 * kMiB);

  // At 500 MiB every chunk's states (1536 MiB) are not enough: gradients
  // follow, and each of them moves once a micro-batch.
  in.host_limit_bytes = 500 * kMiB;
  in.micro_batches = 4;
  plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  EXPECT_EQ(plan.optimizer_chunks_on_disk(), 8);
  EXPECT_GE(plan.grad_chunks_on_disk(), 1);
  EXPECT_LT(plan.grad_chunks_on_disk(), 8);
  EXPECT_EQ(plan.disk_grad_bytes, static_cast<uint64_t>(plan.grad_chunks_on_disk()) * 32 * kMiB);
  EXPECT_EQ(plan.disk_read_bytes_per_step, plan.disk_optimizer_bytes + 4 * plan.disk_grad_bytes);
  EXPECT_EQ(plan.disk_write_bytes_per_step, plan.disk_read_bytes_per_step);
  EXPECT_LE(plan.host_bytes, in.host_limit_bytes);

  // One micro-batch: gradients first, as before.
  in.host_limit_bytes = 1900 * kMiB;
  in.micro_batches = 1;
  plan = PlanTiers(in);
  EXPECT_EQ(plan.grad_chunks_on_disk(), 5);
  EXPECT_EQ(plan.optimizer_chunks_on_disk(), 0);
}

TEST(TierPlanTest, StagingIsASliceOfAChunkHoweverLargeTheChunk) {
  // Two chunks of 80 M parameters (GPT-2 XL's embedding is one): 2.5 GiB of
  // model data. Everything goes to disk; the host keeps the weights and
  // four slots of a few MiB (and while the model is built, a chunk's
  // masters drawn in fp32).
  TierInput in = Bf16({80 * kM, 80 * kM}, 800 * kMiB, 1ull << 40);
  TierPlan plan = PlanTiers(in);
  ASSERT_TRUE(plan.feasible) << plan.problem;
  EXPECT_EQ(plan.grad_chunks_on_disk(), 2);
  EXPECT_EQ(plan.optimizer_chunks_on_disk(), 2);
  EXPECT_LE(plan.slot_bytes, kDiskSliceBytes);
  EXPECT_GE(plan.slot_bytes, kDiskMinSliceBytes - 14 * kDiskSliceQuantum);
  EXPECT_EQ(plan.slot_bytes % (14 * kDiskSliceQuantum), 0u) << "whole quanta of 14-byte elements";
  EXPECT_EQ(plan.host_steady_bytes, 2 * 160 * kMiB + kDiskStagingSlots * plan.slot_bytes);
  // Construction draws a disk chunk's masters in fp32 before writing them.
  EXPECT_EQ(plan.host_construction_bytes, plan.staging_bytes + 2 * 160 * kMiB + 320 * kMiB);
  EXPECT_LE(plan.host_bytes, in.host_limit_bytes);
}

TEST(TierPlanTest, DiskFilesAreWholeBlocksPerRegion) {
  // 10,000 elements in bf16: the states' three fp32 regions of 40,000
  // bytes each start at a block; the gradients are one region of 20,000.
  const uint64_t b = kDiskBlockBytes;
  EXPECT_EQ(DiskRegionBytes(10000, 4), (40000 + b - 1) / b * b);
  EXPECT_EQ(DiskFileBytes(10000, 4, 3), 3 * DiskRegionBytes(10000, 4));
  EXPECT_EQ(DiskFileBytes(10000, 2, 1), (20000 + b - 1) / b * b);
  EXPECT_EQ(DiskRegionBytes(static_cast<int64_t>(b), 2), 2 * b);
  EXPECT_EQ(AlignToDisk(1), kDiskAlignment);
  EXPECT_EQ(AlignToDisk(4096), 4096u);
  EXPECT_EQ(AlignToDisk(0), 0u);
}

TEST(TierPlanTest, WhereNothingFitsTheLeastTheHostCanNeedIsShown) {
  // Moving anything of these small chunks costs more staging (four slots of
  // at least a slice quantum) than it frees.
  TierInput in = Bf16({20000, 20000, 20000}, 900000, 1ull << 40);
  TierPlan plan = PlanTiers(in);
  ASSERT_FALSE(plan.feasible);
  EXPECT_EQ(plan.host_bytes, 960000u) << "everything on the host: 60,000 x 16";
  EXPECT_NE(plan.problem.find("memory.host_budget"), std::string::npos) << plan.problem;
  EXPECT_NE(plan.problem.find("the host needs 937.50 KiB"), std::string::npos) << plan.problem;
}

TEST(TierPlanTest, TooSmallADiskIsNamed) {
  // Five gradients must go to disk (the plan above): 160 MiB.
  TierInput in = Bf16(std::vector<int64_t>(8, 16 * kM), 1900 * kMiB, 150 * kMiB);
  TierPlan plan = PlanTiers(in);
  ASSERT_FALSE(plan.feasible);
  EXPECT_NE(plan.problem.find("memory.disk_budget"), std::string::npos) << plan.problem;
  EXPECT_NE(plan.problem.find("the disk tier needs 160.00 MiB"), std::string::npos) << plan.problem;
}

TEST(TierPlanTest, WithoutADiskTierTheHostLimitIsFinal) {
  TierPlan plan = PlanTiers(FourChunks(50 * kMiB, 0));
  ASSERT_FALSE(plan.feasible);
  for (Tier t : plan.optimizer_tier) EXPECT_EQ(t, Tier::kHost);
  for (Tier t : plan.grad_tier) EXPECT_EQ(t, Tier::kHost);
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
