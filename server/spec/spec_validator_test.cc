#include "server/spec/spec_validator.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <limits>

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
  JobSpec infinite = Resolved("data: {synthetic: {}}");  // only a Submit call can send one
  infinite.mutable_train()->set_grad_clip(std::numeric_limits<double>::infinity());
  EXPECT_NE(ValidateSpec(infinite, Machine()).message().find("train.grad_clip: inf must be 0 (off) or a positive finite"),
            std::string::npos);
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

// A Submit call may carry enum numbers this build has no name for (proto3
// keeps them); the worker, which reads the spec by value names, could not.
TEST(SpecValidatorTest, UnknownEnumValuesAreInvalid) {
  JobSpec spec = Resolved("data: {synthetic: {}}");
  spec.mutable_train()->set_precision(static_cast<ferry::v1::Precision>(6));
  spec.mutable_memory()->set_recompute(static_cast<ferry::v1::RecomputeMode>(65));
  absl::Status s = ValidateSpec(spec, Machine());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("train.precision: 6 is not a value this daemon knows; use one of fp32, fp16, bf16"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("memory.recompute: 65 is not a value"), std::string::npos) << s;
  EXPECT_TRUE(ValidateSpec(Resolved("data: {synthetic: {}}\ntrain: {precision: bf16}"), Machine()).ok());
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

// A fresh directory under the test's temporary directory, resolved.
std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name + ".XXXXXX";
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  char real[PATH_MAX];
  EXPECT_NE(realpath(pattern.c_str(), real), nullptr);
  return real;
}

class AllowedRootsValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = FreshDir("roots");
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
    std::ofstream(root_ + "/t.bin", std::ios::binary) << std::string(2000, '\0');
    std::ofstream(outside_ + "/t.bin", std::ios::binary) << std::string(2000, '\0');
    machine_ = Machine();
    absl::StatusOr<AllowedRoots> roots = AllowedRoots::Make({root_});
    ASSERT_TRUE(roots.ok()) << roots.status();
    machine_.allowed_roots = *roots;
  }
  absl::Status Validate(const std::string& yaml) { return ValidateSpec(Resolved(yaml), machine_); }
  std::string base_, root_, outside_;
  MachineFacts machine_;
};

TEST_F(AllowedRootsValidationTest, PathsInsideAreAccepted) {
  EXPECT_TRUE(Validate("data: {path: " + root_ + "/t.bin}").ok()) << Validate("data: {path: " + root_ + "/t.bin}");
  // A checkpoint directory that does not exist yet, under a root.
  const std::string yaml = "data: {path: " + root_ + "/t.bin}\ncheckpoint: {dir: " + root_ + "/new/ckpt}";
  EXPECT_TRUE(Validate(yaml).ok()) << Validate(yaml);
  // A link that stays inside.
  ASSERT_EQ(symlink((root_ + "/t.bin").c_str(), (root_ + "/alias.bin").c_str()), 0);
  EXPECT_TRUE(Validate("data: {path: " + root_ + "/alias.bin}").ok());
}

TEST_F(AllowedRootsValidationTest, PathsOutsideArePermissionDenied) {
  absl::Status s = Validate("data: {path: /etc/passwd}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("data.path: /etc/passwd is outside the allowed roots (" + root_ +
                             "); put the file under one of them or start ferryd with --allowed_roots "
                             "including its directory"),
            std::string::npos)
      << s;
  // `..` out of the root.
  s = Validate("data: {path: " + root_ + "/../outside/t.bin}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("resolves to " + outside_ + "/t.bin, outside"), std::string::npos) << s;
  // A missing file outside: refused as outside, its absence not told.
  s = Validate("data: {path: " + outside_ + "/missing.bin}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(s.message().find("does not exist"), std::string::npos) << s;
  // Links out: to a file, and a checkpoint directory through a link to a
  // directory.
  ASSERT_EQ(symlink((outside_ + "/t.bin").c_str(), (root_ + "/link.bin").c_str()), 0);
  EXPECT_EQ(Validate("data: {path: " + root_ + "/link.bin}").code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/ckpt").c_str()), 0);
  s = Validate("data: {synthetic: {}}\ncheckpoint: {dir: " + root_ + "/ckpt/run1}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("checkpoint.dir: " + root_ + "/ckpt/run1 resolves to " + outside_ +
                             "/run1, outside the allowed roots (" + root_ + "); put the directory"),
            std::string::npos)
      << s;
  // A malformed field still makes the whole submission INVALID_ARGUMENT,
  // with the path's problem listed too.
  s = Validate("data: {path: /etc/passwd}\nmodel: {layers: 5000}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("outside the allowed roots"), std::string::npos) << s;
}

TEST_F(AllowedRootsValidationTest, DeviceFilesAndFifosAreRefused) {
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  absl::Status s = Validate("data: {path: " + root_ + "/fifo}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("is a FIFO"), std::string::npos) << s;
  MachineFacts everywhere = Machine();  // no roots: still no device files
  s = ValidateSpec(Resolved("data: {path: /dev/zero}"), everywhere);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("data.path: /dev/zero is a character device"), std::string::npos) << s;
  s = ValidateSpec(Resolved("data: {synthetic: {}}\ncheckpoint: {dir: /dev/null}"), everywhere);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
}

TEST_F(AllowedRootsValidationTest, ACheckpointDirectoryMustBeOneOrCreatable) {
  absl::Status s = Validate("data: {synthetic: {}}\ncheckpoint: {dir: " + root_ + "/t.bin}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("is not a directory"), std::string::npos) << s;
  s = Validate("data: {synthetic: {}}\ncheckpoint: {dir: " + root_ + "/t.bin/ckpt}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST(SpecLimitsTest, StringsAreBounded) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  ExpectProblem("data: {path: /" + std::string(5000, 'p') + "}", kInvalid,
                "data.path: 5001 characters, longer than 4096 (PATH_MAX)");
  ExpectProblem("data: {synthetic: {}}\ncheckpoint: {dir: /" + std::string(5000, 'c') + "}", kInvalid,
                "checkpoint.dir: 5001 characters");
  ExpectProblem("data: {synthetic: {}}\nname: \"two\\nlines\"", kInvalid, "name: contains a control character");
  JobSpec spec = Resolved("data: {synthetic: {}}");
  spec.mutable_data()->set_path(std::string("/tmp/a\0b", 8));
  absl::Status s = ValidateSpec(spec, Machine());
  EXPECT_EQ(s.code(), kInvalid) << s;
  EXPECT_NE(s.message().find("data.path: contains a NUL character"), std::string::npos) << s;
  JobSpec preset;
  preset.mutable_model()->set_preset(std::string(1000, 'x'));
  absl::StatusOr<JobSpec> resolved = WithDefaults(preset);
  EXPECT_EQ(resolved.status().code(), kInvalid);
  EXPECT_NE(resolved.status().message().find("model.preset: 1000 characters is not a preset name"),
            std::string::npos)
      << resolved.status();
  EXPECT_LT(resolved.status().message().size(), 200u);
}

TEST(SpecLimitsTest, BudgetsAreCheckedAgainstTheDevice) {
  MachineFacts gpu = Machine();
  gpu.device_memory_bytes = 8 * kGiB;
  absl::Status s = ValidateSpec(Resolved("data: {synthetic: {}}\nmemory: {device_budget: 80GiB}"), gpu);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("memory.device_budget: 80 GiB is more than the device's memory (8 GiB); lower it"),
            std::string::npos)
      << s;
  MachineFacts simulated = Machine();
  simulated.device_is_host_memory = true;
  s = ValidateSpec(Resolved("data: {synthetic: {}}\nmemory: {device_budget: 32GiB}"), simulated);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("the simulated device (there is no GPU)"), std::string::npos) << s;
  // The simulated device's budget is host memory, not more of it: gpt2-xl
  // (23 GiB of state) does not fit 16 GiB of host memory with a 15 GiB
  // "device" either, where a GPU's 15 GiB would add to the host's.
  const std::string xl = "data: {synthetic: {}}\nmodel: {preset: gpt2-xl}\nmemory: {device_budget: 15GiB}";
  s = ValidateSpec(Resolved(xl), simulated);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("the simulated device's memory is host memory too"), std::string::npos) << s;
  gpu.device_memory_bytes = 16 * kGiB;
  EXPECT_TRUE(ValidateSpec(Resolved(xl), gpu).ok()) << ValidateSpec(Resolved(xl), gpu);
}

TEST(SpecLimitsTest, ReplicasAndCheckpointSnapshotsCountOnOneMachine) {
  // gpt2-small: about 124M parameters, 1.85 GiB of training state.
  const JobSpec small = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}");
  const uint64_t state = TrainingStateBytes(small.model());
  MachineFacts machine = Machine();
  machine.host_memory_bytes = state * 3 / 2;
  machine.device_is_host_memory = true;
  EXPECT_TRUE(ValidateSpec(small, machine).ok()) << ValidateSpec(small, machine);
  // A checkpoint's snapshot (12 bytes a parameter) does not fit beside it.
  absl::Status s = ValidateSpec(
      Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\ncheckpoint: {dir: /nonexistent/ckpt}"),
      [&] {
        MachineFacts m = machine;
        m.check_files = false;
        return m;
      }());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("for checkpoint snapshots (12 bytes a parameter)"), std::string::npos) << s;
  // Two data-parallel replicas on this machine do not fit; under a
  // launcher (ranks elsewhere) one rank's share does.
  const JobSpec replicated = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nparallel: {data: 2}");
  machine.ranks_share_host = true;
  s = ValidateSpec(replicated, machine);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("x 2 data-parallel ranks on this machine"), std::string::npos) << s;
  EXPECT_NE(s.message().find("fewer data-parallel ranks (parallel.data)"), std::string::npos) << s;
  machine.ranks_share_host = false;
  EXPECT_TRUE(ValidateSpec(replicated, machine).ok()) << ValidateSpec(replicated, machine);
}

}  // namespace
}  // namespace ferry
