#include "server/worker/job_setup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/test_files.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/test_specs.h"
#include "server/worker/training_fingerprint.h"

namespace ferry {
namespace {

using ferry::v1::JobSpec;

constexpr uint64_t kGiB = 1ull << 30;

JobSpec Resolved(const std::string& yaml) { return testing::ResolvedSpec(yaml); }

MachineFacts Machine(uint64_t free_disk_bytes) {
  MachineFacts m;
  m.host_memory_bytes = 16 * kGiB;
  m.disk = [free_disk_bytes](const std::string&) -> absl::StatusOr<DiskFacts> {
    DiskFacts facts;
    facts.free_bytes = free_disk_bytes;
    return facts;
  };
  return m;
}

TEST(JobSetupTest, TrainingGetsTheBudgetsTheDaemonCheckedAgainst) {
  const JobSpec spec = Resolved(
      "data: {synthetic: {}}\n"
      "model: {preset: llama-tiny}\n"
      "train: {precision: bf16, batch_size: 8, grad_accum_steps: 4}\n");
  const MachineFacts machine = Machine(100 * kGiB);
  std::string warning;
  const JobEngineSetup setup = SetUpJobEngine(spec, EngineUse::kTrain, machine, "/scratch/rank0", &warning);
  EXPECT_EQ(setup.model.model_type, ToModelConfig(spec.model()).model_type);
  EXPECT_EQ(setup.model.ParameterCount(), ToModelConfig(spec.model()).ParameterCount());
  EXPECT_EQ(setup.train.precision, TrainOptions::Precision::kBf16);
  EXPECT_EQ(setup.train.grad_accum_steps, 4);
  EXPECT_EQ(setup.memory.host_budget_bytes, RankHostBudgetBytes(spec, machine));
  EXPECT_GT(setup.memory.host_budget_bytes, 0u);
  EXPECT_EQ(setup.memory.disk_dir, "/scratch/rank0");
  EXPECT_EQ(setup.memory.disk_budget_bytes, 90 * kGiB) << "9/10 of the free space";
  EXPECT_TRUE(warning.empty()) << warning;

  // The spec's own budgets win.
  const JobSpec budgeted = Resolved(
      "data: {synthetic: {}}\n"
      "memory: {host_budget: 3GiB, disk_budget: 5GiB}\n");
  const JobEngineSetup set = SetUpJobEngine(budgeted, EngineUse::kTrain, machine, "/scratch/rank0");
  EXPECT_EQ(set.memory.host_budget_bytes, 3 * kGiB);
  EXPECT_EQ(set.memory.disk_budget_bytes, 5 * kGiB);

  // No directory: no disk tier.
  EXPECT_EQ(SetUpJobEngine(spec, EngineUse::kTrain, machine, "").memory.disk_budget_bytes, 0u);
}

TEST(JobSetupTest, AnUnknownDiskTurnsTheTierOffAndSaysSo) {
  const JobSpec spec = Resolved("data: {synthetic: {}}\n");
  MachineFacts machine = Machine(0);
  machine.disk = [](const std::string&) -> absl::StatusOr<DiskFacts> {
    return absl::UnavailableError("statvfs failed");
  };
  std::string warning;
  const JobEngineSetup setup = SetUpJobEngine(spec, EngineUse::kTrain, machine, "/scratch/rank0", &warning);
  EXPECT_EQ(setup.memory.disk_budget_bytes, 0u);
  EXPECT_NE(warning.find("disk tier: off"), std::string::npos) << warning;
  EXPECT_NE(warning.find("statvfs failed"), std::string::npos) << warning;
}

TEST(JobSetupTest, ReadingPlansWithinNoBudgetAndNoDiskTier) {
  const JobSpec spec = Resolved(
      "data: {synthetic: {}}\n"
      "memory: {host_budget: 3GiB, disk_dir: /var/tmp/x, disk_budget: 5GiB}\n"
      "parallel: {data: 2, shard: optimizer}\n"
      "train: {batch_size: 4}\n");
  const JobEngineSetup setup = SetUpJobEngine(spec, EngineUse::kRead);
  EXPECT_EQ(setup.memory.host_budget_bytes, 0u);
  EXPECT_TRUE(setup.memory.disk_dir.empty());
  EXPECT_EQ(setup.memory.disk_budget_bytes, 0u);
  EXPECT_EQ(setup.memory.shard, MemoryOptions::Shard::kOptimizer) << "the layout the checkpoints were written in";
}

// A checkpoint of `spec`'s training (or of another) at `step` for rank `r`.
void Write(const JobSpec& spec, int r, int64_t step, bool same_training = true) {
  CheckpointContents c;
  c.step = step;
  c.meta["training"] = same_training ? TrainingFingerprint(spec) : "another";
  c.files["rank0.x"] = "x";
  const absl::Status s = WriteCheckpoint(absl::StrCat(spec.checkpoint().dir(), "/rank", r), c, 3);
  ASSERT_TRUE(s.ok()) << s;
}

TEST(JobSetupTest, CheckpointsOfOneStepEveryRankHas) {
  const std::string dir = testing::EmptyTestPath("job_setup_checkpoints");
  std::filesystem::create_directories(dir);
  const JobSpec spec = Resolved(absl::StrCat("data: {synthetic: {}}\ncheckpoint: {dir: ", dir, ", every_steps: 2}\n"));
  const AllowedRoots anywhere;

  absl::StatusOr<std::vector<LoadedCheckpoint>> none = LoadJobCheckpoints(spec, anywhere, 2, "export");
  ASSERT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("no checkpoint yet"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("export after that"), std::string::npos) << none.status();

  Write(spec, 0, 2);
  Write(spec, 0, 4);
  Write(spec, 1, 2);
  absl::StatusOr<std::vector<LoadedCheckpoint>> loaded = LoadJobCheckpoints(spec, anywhere, 2, "export");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].contents.step, 2) << "rank 1 has only step 2";
  EXPECT_EQ((*loaded)[1].contents.step, 2);
  // One rank: its newest.
  loaded = LoadJobCheckpoints(spec, anywhere, 1, "generate");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)[0].contents.step, 4);

  // Another training's checkpoint is refused, naming the directory.
  Write(spec, 1, 6, /*same_training=*/false);
  absl::StatusOr<std::vector<LoadedCheckpoint>> other = LoadJobCheckpoints(spec, anywhere, 2, "export");
  ASSERT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("another training"), std::string::npos) << other.status();
  EXPECT_NE(other.status().message().find(dir + "/rank1"), std::string::npos) << other.status();

  // A job without checkpoints says how to get some.
  const JobSpec plain = Resolved("data: {synthetic: {}}\n");
  absl::StatusOr<std::vector<LoadedCheckpoint>> kept = LoadJobCheckpoints(plain, anywhere, 1, "generate");
  ASSERT_EQ(kept.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(kept.status().message().find("keeps no checkpoints"), std::string::npos) << kept.status();
}

}  // namespace
}  // namespace ferry
