#include "server/spec/spec_validator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"

namespace ferry {
namespace {

using ferry::v1::JobSpec;

constexpr uint64_t kGiB = 1ull << 30;

MachineFacts Machine() {
  MachineFacts m;
  m.host_memory_bytes = 16 * kGiB;
  return m;
}

JobSpec Resolved(const std::string& yaml) {
  absl::StatusOr<JobSpec> parsed = ParseJobSpec(yaml, "/base");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<JobSpec> resolved = WithDefaults(*parsed);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return *resolved;
}

std::string TempFile(const std::string& name, size_t bytes) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << std::string(bytes, '\0');
  return path;
}

void ExpectProblem(const std::string& yaml, absl::StatusCode code, const std::string& needle) {
  absl::Status s = ValidateSpec(Resolved(yaml), Machine());
  EXPECT_EQ(s.code(), code) << yaml << " -> " << s;
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "'" << s.message() << "' lacks '" << needle << "'";
}

TEST(SpecDefaultsTest, EmptySpecBecomesTinyPresetWithDefaults) {
  JobSpec spec = Resolved("data: {synthetic: {}}");
  EXPECT_EQ(spec.model().preset(), "gpt2-tiny");
  EXPECT_EQ(spec.model().layers(), 2u);
  EXPECT_EQ(spec.model().vocab_size(), 256u);
  EXPECT_EQ(spec.data().synthetic().branching(), 2u);
  EXPECT_EQ(spec.train().steps(), 100u);
  EXPECT_EQ(spec.train().warmup_steps(), 5u);
  EXPECT_DOUBLE_EQ(spec.train().min_lr(), spec.train().lr() / 10);
  EXPECT_EQ(spec.train().precision(), ferry::v1::PRECISION_FP32);
  EXPECT_EQ(spec.memory().policy(), ferry::v1::MEMORY_POLICY_AUTO);
  EXPECT_EQ(spec.parallel().tensor(), 1u);
  EXPECT_TRUE(ValidateSpec(spec, Machine()).ok()) << ValidateSpec(spec, Machine());
}

TEST(SpecDefaultsTest, FieldsOverrideThePresetAndDefaultsAreIdempotent) {
  JobSpec spec = Resolved("model: {preset: gpt2-small, layers: 3, dropout: 0}\ndata: {synthetic: {}}");
  EXPECT_EQ(spec.model().layers(), 3u);
  EXPECT_EQ(spec.model().hidden(), 768u);
  EXPECT_DOUBLE_EQ(spec.model().dropout(), 0.0);
  absl::StatusOr<JobSpec> again = WithDefaults(spec);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), spec.SerializeAsString());
}

TEST(SpecDefaultsTest, UnknownPresetIsInvalid) {
  absl::StatusOr<JobSpec> parsed = ParseJobSpec("model: {preset: gpt5}", "/");
  ASSERT_TRUE(parsed.ok());
  absl::StatusOr<JobSpec> resolved = WithDefaults(*parsed);
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(resolved.status().message().find("model.preset: unknown preset 'gpt5'"),
            std::string::npos);
}

TEST(SpecDefaultsTest, RecomputeModes) {
  EXPECT_EQ(Resolved("data: {synthetic: {}}").memory().recompute(), ferry::v1::RECOMPUTE_MODE_AUTO);
  for (const char* mode : {"none", "all", "auto"}) {
    JobSpec spec = Resolved(std::string("data: {synthetic: {}}\nmemory: {recompute: ") + mode + "}");
    EXPECT_EQ(ToMemoryOptions(spec.memory()).recompute == MemoryOptions::Recompute::kNone, std::string(mode) == "none");
    EXPECT_EQ(ToMemoryOptions(spec.memory()).recompute == MemoryOptions::Recompute::kAll, std::string(mode) == "all");
    EXPECT_EQ(ToMemoryOptions(spec.memory()).recompute == MemoryOptions::Recompute::kAuto, std::string(mode) == "auto");
    EXPECT_TRUE(ValidateSpec(spec, Machine()).ok()) << mode;
  }
  JobSpec every = Resolved("data: {synthetic: {}}\nmemory: {recompute: every}");
  EXPECT_EQ(ToMemoryOptions(every.memory()).recompute, MemoryOptions::Recompute::kEvery);
  EXPECT_EQ(ToMemoryOptions(every.memory()).recompute_every, 2);
  // recompute_every alone means every k-th block.
  JobSpec third = Resolved("data: {synthetic: {}}\nmemory: {recompute_every: 3}");
  EXPECT_EQ(third.memory().recompute(), ferry::v1::RECOMPUTE_MODE_EVERY);
  EXPECT_EQ(ToMemoryOptions(third.memory()).recompute_every, 3);
  // Beside another mode it would be ignored: refused, saying so.
  absl::StatusOr<JobSpec> parsed = ParseJobSpec("memory: {recompute: all, recompute_every: 3}", "/");
  ASSERT_TRUE(parsed.ok());
  absl::StatusOr<JobSpec> resolved = WithDefaults(*parsed);
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(resolved.status().message().find("memory.recompute_every: applies only with memory.recompute: every"),
            std::string::npos)
      << resolved.status();
  ExpectProblem("data: {synthetic: {}}\nmemory: {recompute: every, recompute_every: 5000}",
                absl::StatusCode::kInvalidArgument, "memory.recompute_every: 5000 is out of range");
}

TEST(SpecDefaultsTest, CheckpointDefaults) {
  JobSpec spec = Resolved("data: {synthetic: {}}\ncheckpoint: {dir: ckpt}");
  EXPECT_EQ(spec.checkpoint().every_steps(), 100u);
  EXPECT_EQ(spec.checkpoint().keep(), 2u);
  EXPECT_EQ(spec.checkpoint().on_error(), ferry::v1::CHECKPOINT_ON_ERROR_CONTINUE);
  EXPECT_TRUE(ValidateSpec(spec, Machine()).ok());
  JobSpec fail = Resolved("data: {synthetic: {}}\ncheckpoint: {dir: ckpt, on_error: fail}");
  EXPECT_EQ(fail.checkpoint().on_error(), ferry::v1::CHECKPOINT_ON_ERROR_FAIL);
  EXPECT_TRUE(ValidateSpec(fail, Machine()).ok());
  // No checkpoints, no defaults.
  EXPECT_EQ(Resolved("data: {synthetic: {}}").checkpoint().on_error(), ferry::v1::CHECKPOINT_ON_ERROR_UNSPECIFIED);
}

TEST(SpecValidatorTest, MalformedFieldsAreInvalidArgument) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  ExpectProblem("{}", kInvalid, "data: set path");
  ExpectProblem("data: {synthetic: {}}\nmodel: {hidden: 100, heads: 3}", kInvalid,
                "model.hidden: 100 is not a multiple of model.heads (3)");
  ExpectProblem("data: {synthetic: {}}\nmodel: {layers: 5000}", kInvalid,
                "model.layers: 5000 is out of range; use 1 to 1024");
  ExpectProblem("data: {synthetic: {}}\nmodel: {dropout: 1.5}", kInvalid, "model.dropout");
  ExpectProblem("data: {synthetic: {}}\ntrain: {lr: -1}", kInvalid, "train.lr");
  ExpectProblem("data: {synthetic: {}}\ntrain: {steps: 10, warmup_steps: 20}", kInvalid,
                "train.warmup_steps: 20 is more than train.steps (10)");
  ExpectProblem("data: {synthetic: {branching: 999}}", kInvalid, "data.synthetic.branching");
  ExpectProblem("data: {path: ''}", kInvalid, "data.path: is empty");
  ExpectProblem("data: {synthetic: {}}\ncheckpoint: {keep: 3}", kInvalid, "checkpoint.dir");
  ExpectProblem("data: {synthetic: {}}\ncheckpoint: {on_error: fail}", kInvalid, "checkpoint.dir");
  ExpectProblem("data: {synthetic: {}}\nname: " + std::string(200, 'n'), kInvalid, "name: 200");
}

TEST(SpecValidatorTest, RelativePathsOverTheApiAreInvalid) {
  JobSpec spec = Resolved("data: {synthetic: {}}");
  spec.mutable_data()->set_path("tokens.bin");
  absl::Status s = ValidateSpec(spec, Machine());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be an absolute path"), std::string::npos);
}

TEST(SpecValidatorTest, ReportsEveryProblemAtOnce) {
  absl::Status s = ValidateSpec(
      Resolved("data: {synthetic: {}}\nmodel: {layers: 0, hidden: 7, heads: 2}\ntrain: {lr: 100}"),
      Machine());
  EXPECT_NE(s.message().find("model.hidden"), std::string::npos);
  EXPECT_NE(s.message().find("train.lr"), std::string::npos);
}

TEST(SpecValidatorTest, DataFileProblemsAreFailedPrecondition) {
  const auto kPrecondition = absl::StatusCode::kFailedPrecondition;
  ExpectProblem("data: {path: /nonexistent/tokens.bin}", kPrecondition,
                "data.path: /nonexistent/tokens.bin does not exist");
  ExpectProblem("data: {path: " + TempFile("odd.bin", 301) + "}", kPrecondition, "odd size");
  ExpectProblem("data: {path: " + TempFile("short.bin", 100) + "}", kPrecondition,
                "fewer than one window");
  ExpectProblem("data: {path: /tmp}", kPrecondition, "not a regular file");
  const std::string good = TempFile("good.bin", 2 * 1000);
  EXPECT_TRUE(ValidateSpec(Resolved("data: {path: " + good + "}"), Machine()).ok());
  MachineFacts no_files = Machine();
  no_files.check_files = false;
  EXPECT_TRUE(ValidateSpec(Resolved("data: {path: /nonexistent/t.bin}"), no_files).ok());
}

TEST(SpecValidatorTest, ModelsTooLargeForTheMachineAreRefused) {
  // gpt2-xl: 1.56e9 parameters x 16 bytes = 23 GiB > 16 GiB.
  ExpectProblem("data: {synthetic: {}}\nmodel: {preset: gpt2-xl}",
                absl::StatusCode::kFailedPrecondition, "choose a smaller model");
  ExpectProblem("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nmemory: {host_budget: 1GiB}",
                absl::StatusCode::kFailedPrecondition, "of memory.host_budget");
  ExpectProblem("data: {synthetic: {}}\nmemory: {host_budget: 1TiB}",
                absl::StatusCode::kFailedPrecondition, "memory.host_budget: 1 TiB is more than");
}

TEST(SpecValidatorTest, ParallelShapes) {
  auto check = [&](const std::string& yaml) { return ValidateSpec(Resolved(yaml), Machine()); };
  EXPECT_TRUE(check("data: {synthetic: {}}\nparallel: {tensor: 2, data: 2}").ok());
  absl::Status heads = check("data: {synthetic: {}}\nmodel: {heads: 4, hidden: 128}\nparallel: {tensor: 3}");
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(heads.message().find("parallel.tensor: 3 ranks cannot split model.heads (4)"), std::string::npos)
      << heads;
  EXPECT_NE(heads.message().find("model.vocab_size (256)"), std::string::npos) << heads;
  absl::Status batch = check("data: {synthetic: {}}\ntrain: {batch_size: 6}\nparallel: {data: 4}");
  EXPECT_NE(batch.message().find("train.batch_size: 6 does not split across 4 data-parallel ranks"),
            std::string::npos)
      << batch;
}

TEST(SpecValidatorTest, MixedPrecisionAndItsLossScale) {
  for (const char* precision : {"fp16", "bf16"}) {
    JobSpec spec = Resolved(std::string("data: {synthetic: {}}\ntrain: {precision: ") + precision + "}");
    EXPECT_TRUE(ValidateSpec(spec, Machine()).ok()) << precision;
    EXPECT_EQ(spec.train().loss_scale(), 65536.0);
    EXPECT_EQ(spec.train().loss_scale_growth_interval(), 1000u);
  }
  ExpectProblem("data: {synthetic: {}}\ntrain: {precision: fp16, loss_scale: 0.5}",
                absl::StatusCode::kInvalidArgument, "train.loss_scale: 0.5 is out of range");
}

}  // namespace
}  // namespace ferry
