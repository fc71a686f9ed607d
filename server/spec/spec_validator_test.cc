#include "server/spec/spec_validator.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint/safetensors.h"
#include "engine/data/token_file.h"
#include "engine/model/gpt2_weights.h"
#include "engine/model/hf_layout.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/test_specs.h"

namespace ferry {
namespace {

using ferry::v1::JobSpec;

constexpr uint64_t kGiB = 1ull << 30;

MachineFacts Machine() {
  MachineFacts m;
  m.host_memory_bytes = 16 * kGiB;
  return m;
}

JobSpec Resolved(const std::string& yaml) { return testing::ResolvedSpec(yaml); }

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

TEST(SpecDefaultsTest, TheDiskTierReachesTheEngineAsSet) {
  const MemoryOptions unset = ToMemoryOptions(Resolved("data: {synthetic: {}}").memory());
  EXPECT_EQ(unset.disk_dir, "") << "the worker fills in the job's own directory";
  EXPECT_EQ(unset.disk_budget_bytes, 0u);
  const MemoryOptions set =
      ToMemoryOptions(Resolved("data: {synthetic: {}}\nmemory: {disk_dir: /nvme, disk_budget: 20GiB}").memory());
  EXPECT_EQ(set.disk_dir, "/nvme");
  EXPECT_EQ(set.disk_budget_bytes, 20 * kGiB);
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
  ExpectProblem("data: {path: " + TempFile("odd.bin", 301) + "}", kPrecondition, "not a whole number of uint16 tokens");
  ExpectProblem("data: {path: " + TempFile("short.bin", 100) + "}", kPrecondition,
                "fewer than one window");
  ExpectProblem("data: {path: /tmp}", kPrecondition, "not a regular file");
  const std::string good = TempFile("good.bin", 2 * 1000);
  EXPECT_TRUE(ValidateSpec(Resolved("data: {path: " + good + "}"), Machine()).ok());
  MachineFacts no_files = Machine();
  no_files.check_files = false;
  EXPECT_TRUE(ValidateSpec(Resolved("data: {path: /nonexistent/t.bin}"), no_files).ok());
}

// A token file with a header recording `vocab_size`, holding `tokens` zeros.
std::string HeaderTokenFile(const std::string& name, int64_t vocab_size, int64_t tokens) {
  TokenFileInfo info;
  info.tokenizer = {"gpt2", {"/models/vocab.json", "/models/merges.txt"}};
  info.vocab_size = vocab_size;
  info.token_bytes = TokenBytesFor(vocab_size);
  info.token_count = tokens;
  const std::string path = TempFile(name, 0);
  std::ofstream out(path, std::ios::binary);
  out << EncodeTokenFileHeader(info) << std::string(static_cast<size_t>(tokens * info.token_bytes), '\0');
  return path;
}

TEST(SpecValidatorTest, ATokenFileWithALargerVocabularyThanTheModelIsInvalid) {
  const std::string path = HeaderTokenFile("gpt2.bin", 50257, 2000);
  absl::Status s = ValidateSpec(Resolved("data: {path: " + path + "}\nmodel: {vocab_size: 256}"), Machine());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("data.path: " + path), std::string::npos) << s;
  EXPECT_NE(s.message().find("50257"), std::string::npos) << s;
  EXPECT_NE(s.message().find("model.vocab_size 256"), std::string::npos) << s;
  EXPECT_NE(s.message().find("set model.vocab_size to at least 50257"), std::string::npos) << s;
  EXPECT_TRUE(ValidateSpec(Resolved("data: {path: " + path + "}\nmodel: {vocab_size: 50304}"), Machine()).ok());
  // uint32 tokens: vocabularies above 65536 are fine now.
  const std::string wide = HeaderTokenFile("wide.bin", 100000, 2000);
  EXPECT_TRUE(ValidateSpec(Resolved("data: {path: " + wide + "}\nmodel: {vocab_size: 100000}"), Machine()).ok());
  // Too few tokens: counted from the header, not the file's size.
  ExpectProblem("data: {path: " + HeaderTokenFile("few.bin", 256, 10) + "}", absl::StatusCode::kFailedPrecondition,
                "holds 10 tokens");
  // A damaged header.
  const std::string damaged = HeaderTokenFile("damaged.bin", 256, 2000);
  std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.put(7);
  f.close();
  ExpectProblem("data: {path: " + damaged + "}", absl::StatusCode::kInvalidArgument, "damaged token file header");
}

// A file system for the disk tier with `free` bytes free.
std::function<absl::StatusOr<DiskFacts>(const std::string&)> FakeDisk(uint64_t free, bool read_only = false,
                                                                      bool writable = true) {
  return [=](const std::string& dir) -> absl::StatusOr<DiskFacts> {
    DiskFacts facts;
    facts.existing = dir;
    facts.free_bytes = free;
    facts.read_only = read_only;
    facts.writable = writable;
    if (!writable) facts.not_writable_reason = "Permission denied";
    return facts;
  };
}

// The daemon's view: each job's scratch directory under its state
// directory, on a file system with `free` bytes free.
MachineFacts MachineWithDisk(uint64_t free) {
  MachineFacts m = Machine();
  m.default_disk_dir = "/state/jobs";
  m.disk = FakeDisk(free);
  return m;
}

TEST(SpecValidatorTest, ModelsTooLargeForTheMachineAreRefused) {
  // gpt2-xl: 1.56e9 parameters x 16 bytes = 23 GiB, more than the 12 GiB
  // of the 16 GiB that model data may have by default, with no disk tier.
  ExpectProblem("data: {synthetic: {}}\nmodel: {preset: gpt2-xl}",
                absl::StatusCode::kFailedPrecondition, "choose a smaller model");
  ExpectProblem("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nmemory: {host_budget: 1GiB}",
                absl::StatusCode::kFailedPrecondition, "of memory.host_budget");
  ExpectProblem("data: {synthetic: {}}\nmemory: {host_budget: 1TiB}",
                absl::StatusCode::kFailedPrecondition, "memory.host_budget: 1 TiB is more than");
}

// gpt2-xl in bf16: 1.56e9 parameters, 2 + 2 bytes of weights and
// gradients (5.8 GiB) in host memory, 12 of optimizer states (17.4 GiB)
// where they fit.
const char kXlBf16[] = "data: {synthetic: {}}\nmodel: {preset: gpt2-xl}\ntrain: {precision: bf16}";

TEST(SpecValidatorTest, TheDiskTierTakesTheOptimizerStatesHostMemoryCannotHold) {
  const MachineFacts machine = MachineWithDisk(1ull << 40);
  const std::string xl = std::string(kXlBf16) + "\nmemory: {host_budget: 12GiB}";
  absl::Status s = ValidateSpec(Resolved(xl), machine);
  EXPECT_TRUE(s.ok()) << s;
  // The same with a directory of its own for the tier.
  s = ValidateSpec(Resolved(std::string(kXlBf16) + "\nmemory: {host_budget: 12GiB, disk_dir: /scratch/ferry}"),
                   [&] {
                     MachineFacts m = machine;
                     m.default_disk_dir = "";
                     return m;
                   }());
  EXPECT_TRUE(s.ok()) << s;
  // Without a disk tier it does not fit.
  s = ValidateSpec(Resolved(xl), Machine());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("there is no disk tier"), std::string::npos) << s;

  // A disk budget too small for what does not fit the host.
  s = ValidateSpec(Resolved(std::string(kXlBf16) + "\nmemory: {host_budget: 12GiB, disk_budget: 4GiB}"), machine);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("more than the 4.00 GiB of memory.disk_budget"), std::string::npos) << s;
  // The default budget is 9/10 of the free space: 10 GiB free is too little.
  s = ValidateSpec(Resolved(xl), MachineWithDisk(10ull << 30));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("more than the 9.00 GiB the disk tier may take (9/10 of the free space under "),
            std::string::npos)
      << s;
  // A full disk, with no budget of the job's own: named as full, not as no
  // disk tier.
  s = ValidateSpec(Resolved(xl), MachineWithDisk(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("has no room (its file system is full)"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("there is no disk tier"), std::string::npos) << s;
  // A budget the file system cannot give.
  s = ValidateSpec(Resolved(std::string(kXlBf16) + "\nmemory: {host_budget: 12GiB, disk_budget: 100GiB}"),
                   MachineWithDisk(10ull << 30));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("memory.disk_budget: the disk tier needs"), std::string::npos) << s;
  EXPECT_NE(s.message().find("but only 10 GiB is free under /state/jobs"), std::string::npos) << s;

  // A host budget far too small even with every optimizer state on disk:
  // the weights and gradients alone need more.
  s = ValidateSpec(Resolved(std::string(kXlBf16) + "\nmemory: {host_budget: 1GiB}"), machine);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("chunks on disk the host needs"), std::string::npos) << s;
  EXPECT_NE(s.message().find("of memory.host_budget. Raise memory.host_budget"), std::string::npos) << s;
  // Unknown free space (the CLI's local check): only a budget set bounds it.
  MachineFacts local = machine;
  local.check_files = false;
  EXPECT_TRUE(ValidateSpec(Resolved(xl), local).ok());
}

// examples/finetune.yaml is a valid job: its model is read from the weights
// at submit (files are not checked here).
TEST(SpecValidatorTest, TheFineTuningExampleIsAValidJob) {
  absl::StatusOr<JobSpec> parsed = LoadJobFile(std::string(std::getenv("TEST_SRCDIR")) +
                                               "/ferry/examples/finetune.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<JobSpec> spec = WithDefaults(*parsed);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().layers(), 0u) << "the architecture comes from the weights";
  EXPECT_EQ(spec->train().grad_accum_steps(), 4u);
  EXPECT_DOUBLE_EQ(spec->data().eval().held_out_fraction(), 0.05);
  MachineFacts local = Machine();
  local.check_files = false;
  EXPECT_TRUE(ValidateSpec(*spec, local).ok()) << ValidateSpec(*spec, local);
}

// examples/llama-finetune.yaml: its folder's config.json gives the model
// (Llama-3.2-1B's as published), and the job fits what it asks for on a
// 24 GiB machine without a GPU, with a disk tier.
TEST(SpecValidatorTest, TheLlamaFineTuningExampleIsAValidJob) {
  absl::StatusOr<JobSpec> parsed = LoadJobFile(std::string(std::getenv("TEST_SRCDIR")) +
                                               "/ferry/examples/llama-finetune.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string folder = std::string(tmp != nullptr ? tmp : "/tmp") + "/Llama-3.2-1B";
  mkdir(folder.c_str(), 0755);
  std::ofstream(folder + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
    "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "vocab_size": 128256})";
  parsed->mutable_model()->set_init_from(folder);
  absl::StatusOr<JobSpec> spec = WithDefaults(*parsed);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().dropout(), 0.0);
  ASSERT_TRUE(ResolveModelFromWeights(&*spec, Machine()).ok()) << ResolveModelFromWeights(&*spec, Machine());
  EXPECT_EQ(spec->model().layers(), 16u);
  EXPECT_EQ(spec->model().seq_len(), 512u) << "the job file's";
  EXPECT_EQ(ToModelConfig(spec->model()).ParameterCount(), 1235814400);
  EXPECT_EQ(spec->train().grad_accum_steps(), 8u);
  MachineFacts machine = MachineWithDisk(64 * kGiB);
  machine.host_memory_bytes = 24 * kGiB;
  machine.device_is_host_memory = true;
  machine.check_files = false;  // no weights here; the folder's check has its own test
  // A 1 GiB device: the tied embedding (128256 x 2048, 501 MiB in bf16) is
  // kept in four pieces, each with a stage of its own (VocabPieces), so no
  // step needs the whole matrix and its gradient on the device at once.
  EXPECT_EQ(spec->memory().device_budget(), 1 * kGiB);
  EXPECT_TRUE(ValidateSpec(*spec, machine).ok()) << ValidateSpec(*spec, machine);

  // At 192 MiB the backward of a piece of the head cannot run (its 125.25
  // MiB of weights and their gradient; the other pieces' gradients wait on
  // the host): said at submit, not after the model is built.
  spec->mutable_memory()->set_device_budget(192 << 20);
  const absl::Status small = ValidateSpec(*spec, machine);
  EXPECT_EQ(small.code(), absl::StatusCode::kFailedPrecondition) << small;
  for (const char* part : {"memory.device_budget: the step cannot fit the device's 192.00 MiB",
                           "the backward of the head needs 250.50 MiB", "raise memory.device_budget to well above"}) {
    EXPECT_NE(small.message().find(part), std::string::npos) << part << " not in " << small;
  }
}

// The device's least need, every chunk streamed and no activations: a
// period's chunks' weights and the gradients being accumulated then.
TEST(SpecValidatorTest, RankDevicePlanInputHasEachStagesChunks) {
  const JobSpec spec = Resolved("data: {synthetic: {}}\nmodel: {preset: qwen2-tiny}\ntrain: {precision: bf16}");
  absl::StatusOr<PlanInput> in = RankDevicePlanInput(spec, 1 * kGiB);
  ASSERT_TRUE(in.ok()) << in.status();
  const int stages = static_cast<int>(spec.model().layers()) + 2;
  ASSERT_EQ(in->forward_periods, stages);
  ASSERT_EQ(in->period_chunks.size(), static_cast<size_t>(2 * stages + 1));
  EXPECT_TRUE(in->period_chunks.back().empty()) << "the optimizer computes with no weights on the device";
  // Tied: the head's periods include the embedding's chunk.
  const int embedding = in->period_chunks[0][0];
  for (int period : {stages - 1, stages}) {
    const std::vector<int>& head = in->period_chunks[static_cast<size_t>(period)];
    EXPECT_NE(std::find(head.begin(), head.end(), embedding), head.end()) << period;
  }
  uint64_t weights = 0;
  for (uint64_t b : in->param_bytes) weights += b;
  EXPECT_EQ(weights % 2, 0u);
  EXPECT_GE(weights, 2 * static_cast<uint64_t>(ToModelConfig(spec.model()).ParameterCount())) << "bf16 weights";
  EXPECT_TRUE(EvaluatePlan(*in, std::vector<ChunkClass>(in->param_bytes.size(), ChunkClass::kStreamed)).feasible);
}

// examples/gpt2-xl-no-gpu.yaml says it needs about 16 GiB of memory and
// 15 GiB of free disk.
TEST(SpecValidatorTest, GptXlWithoutAGpuFitsWhatItsExampleSays) {
  absl::StatusOr<JobSpec> parsed = LoadJobFile(std::string(std::getenv("TEST_SRCDIR")) +
                                               "/ferry/examples/gpt2-xl-no-gpu.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<JobSpec> spec = WithDefaults(*parsed);
  ASSERT_TRUE(spec.ok()) << spec.status();
  MachineFacts machine = MachineWithDisk(15 * kGiB);
  machine.device_is_host_memory = true;
  EXPECT_TRUE(ValidateSpec(*spec, machine).ok()) << ValidateSpec(*spec, machine);
  machine.disk = FakeDisk(10 * kGiB);
  EXPECT_EQ(ValidateSpec(*spec, machine).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SpecValidatorTest, TheDiskBudgetHasAFloorAndNoOffSwitch) {
  ExpectProblem("data: {synthetic: {}}\nmemory: {disk_budget: 4KiB}", absl::StatusCode::kInvalidArgument,
                "memory.disk_budget: 4 KiB is too small for the disk tier; use at least 1MiB");
  // A model that fits the host never uses the disk, whatever its budget.
  EXPECT_TRUE(ValidateSpec(Resolved("data: {synthetic: {}}\nmemory: {disk_budget: 1MiB}"), MachineWithDisk(0)).ok());
}

TEST(SpecValidatorTest, TheDiskDirectoryMustBeWritable) {
  MachineFacts machine = Machine();
  machine.disk = FakeDisk(1ull << 40, /*read_only=*/true);
  const JobSpec spec = Resolved("data: {synthetic: {}}\nmemory: {disk_dir: /mnt/ro/ferry}");
  absl::Status s = ValidateSpec(spec, machine);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("memory.disk_dir: /mnt/ro/ferry is on a read-only file system"), std::string::npos) << s;
  machine.disk = FakeDisk(1ull << 40, /*read_only=*/false, /*writable=*/false);
  s = ValidateSpec(spec, machine);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("memory.disk_dir: /mnt/ro/ferry cannot be written by the daemon (/mnt/ro/ferry: "
                             "Permission denied)"),
            std::string::npos)
      << s;
  // Relative over the API.
  JobSpec relative = Resolved("data: {synthetic: {}}");
  relative.mutable_memory()->set_disk_dir("scratch");
  s = ValidateSpec(relative, Machine());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("memory.disk_dir: 'scratch' must be an absolute path"), std::string::npos) << s;
}

TEST(SpecValidatorTest, ProbeDiskLooksAtTheDeepestExistingDirectory) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  char real[PATH_MAX];
  ASSERT_NE(realpath(tmp != nullptr ? tmp : "/tmp", real), nullptr);
  absl::StatusOr<DiskFacts> facts = ProbeDisk(std::string(real) + "/not/yet/there");
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_EQ(facts->existing, real);
  EXPECT_GT(facts->free_bytes, 0u);
  EXPECT_FALSE(facts->read_only);
  EXPECT_TRUE(facts->writable) << facts->not_writable_reason;
  EXPECT_FALSE(ProbeDisk("relative").ok());
}

TEST(SpecValidatorTest, RankBudgetsSplitTheMachine) {
  const JobSpec one = Resolved("data: {synthetic: {}}");
  MachineFacts machine = Machine();
  EXPECT_EQ(RankHostBudgetBytes(one, machine), DefaultHostBudgetBytes(16 * kGiB, 0));
  EXPECT_EQ(RankDiskBudgetBytes(one, machine, 100 * kGiB), DefaultDiskBudgetBytes(100 * kGiB));
  // The simulated device (a quarter of host memory by default) is host
  // memory; four ranks on this machine share what is left (a checkpoint
  // takes nothing beside it: it streams where it cannot snapshot).
  machine.device_is_host_memory = true;
  machine.ranks_share_host = true;
  const JobSpec four = Resolved("data: {synthetic: {}}\nparallel: {data: 4}\ncheckpoint: {dir: /ckpt}");
  EXPECT_EQ(RankHostBudgetBytes(four, machine), 1u) << "four default devices take it all: the least limit, not none";
  machine.host_memory_bytes = 64 * kGiB;
  const JobSpec four_small_devices =
      Resolved("data: {synthetic: {}}\nparallel: {data: 4}\ncheckpoint: {dir: /ckpt}\nmemory: {device_budget: 1GiB}");
  EXPECT_EQ(RankHostBudgetBytes(four_small_devices, machine),
            DefaultHostBudgetBytes(64 * kGiB, 4 * kGiB) / 4);
  EXPECT_EQ(RankDiskBudgetBytes(four, machine, 100 * kGiB), DefaultDiskBudgetBytes(100 * kGiB) / 4);
  // Budgets set in the spec are taken as they are, per rank.
  const JobSpec set = Resolved("data: {synthetic: {}}\nparallel: {data: 4}\nmemory: {host_budget: 2GiB, disk_budget: 3GiB}");
  EXPECT_EQ(RankHostBudgetBytes(set, machine), 2 * kGiB);
  EXPECT_EQ(RankDiskBudgetBytes(set, machine, 100 * kGiB), 3 * kGiB);
  machine.host_memory_bytes = 0;
  EXPECT_EQ(RankHostBudgetBytes(one, machine), 0u) << "unknown memory: no limit";
}

// parallel.shard: optimizer (the default with data ranks) divides each
// rank's optimizer states by the data ranks in the submit-time estimate;
// the weights and gradients stay; full divides them too.
TEST(SpecValidatorTest, ShardedOptimizerStatesDivideTheRanksEstimate) {
  const JobSpec whole =
      Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nparallel: {data: 4, shard: none}");
  const JobSpec sharded = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nparallel: {data: 4}");
  EXPECT_EQ(sharded.parallel().shard(), ferry::v1::SHARD_MODE_OPTIMIZER) << "the default with data ranks";
  EXPECT_EQ(Resolved("data: {synthetic: {}}").parallel().shard(), ferry::v1::SHARD_MODE_NONE)
      << "the default with one";
  absl::StatusOr<TierInput> a = RankTierInput(whole), b = RankTierInput(sharded);
  ASSERT_TRUE(a.ok() && b.ok());
  uint64_t states_whole = 0, states_sharded = 0, params_whole = 0, params_sharded = 0;
  for (size_t c = 0; c < a->elements.size(); ++c) {
    states_whole += a->optimizer_bytes(c);
    params_whole += a->param_bytes(c);
  }
  for (size_t c = 0; c < b->elements.size(); ++c) {
    states_sharded += b->optimizer_bytes(c);
    params_sharded += b->param_bytes(c);
  }
  // (Chunks padded to whole shards on disk blocks: 1.2% here.)
  EXPECT_NEAR(double(states_sharded) * 4 / double(states_whole), 1.0, 0.02);
  EXPECT_NEAR(double(params_sharded) / double(params_whole), 1.0, 0.02);
  EXPECT_LT(states_sharded * 3, states_whole);
  // full: the weights' and gradients' host copies too.
  const JobSpec full =
      Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nparallel: {data: 4, shard: full}");
  absl::StatusOr<TierInput> f = RankTierInput(full);
  ASSERT_TRUE(f.ok()) << f.status();
  uint64_t states_full = 0, params_full = 0, grads_full = 0;
  for (size_t c = 0; c < f->elements.size(); ++c) {
    states_full += f->optimizer_bytes(c);
    params_full += f->param_bytes(c);
    grads_full += f->grad_bytes(c);
  }
  EXPECT_EQ(states_full, states_sharded);
  EXPECT_NEAR(double(params_full) * 4 / double(params_whole), 1.0, 0.02);
  EXPECT_EQ(grads_full, params_full);
  // One data rank: nothing to shard.
  const JobSpec one = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nparallel: {shard: optimizer}");
  absl::StatusOr<TierInput> c = RankTierInput(one);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->optimizer_bytes(0), a->optimizer_bytes(0));
}

TEST(SpecValidatorTest, RankTierInputIsTheChunkManagersLayout) {
  // gpt2-small: 14 stages, at most 64 chunks, none spanning two stages.
  const JobSpec small = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}");
  absl::StatusOr<TierInput> in = RankTierInput(small);
  ASSERT_TRUE(in.ok()) << in.status();
  const size_t chunks = in->elements.size();
  EXPECT_GE(chunks, 14u);
  EXPECT_LE(chunks, 64u);
  uint64_t params = 0;
  for (size_t c = 0; c < chunks; ++c) {
    params += static_cast<uint64_t>(in->elements[c]);
    EXPECT_EQ(in->param_bytes(c), 4 * static_cast<uint64_t>(in->elements[c]));
    EXPECT_EQ(in->grad_bytes(c), in->param_bytes(c));
    EXPECT_EQ(in->optimizer_bytes(c), 2 * in->param_bytes(c)) << "fp32: two moments";
  }
  EXPECT_EQ(params, static_cast<uint64_t>(ToModelConfig(small.model()).ParameterCount())) << "no capacity wasted";
  // Built without values, drawn a parameter at a time straight into the
  // chunks: no scratch.
  const ModelConfig config = ToModelConfig(small.model());
  EXPECT_EQ(in->init_scratch_bytes, 0u);
  EXPECT_EQ(in->built_bytes, 0u);
  EXPECT_FALSE(in->masters_with_optimizer);
  // bf16: 2 bytes of weights, 12 of states; a chunk size caps each chunk.
  const JobSpec bf16 =
      Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\ntrain: {precision: bf16}\nmemory: {chunk_size: 4MiB}");
  in = RankTierInput(bf16);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_GT(in->elements.size(), chunks);
  EXPECT_TRUE(in->masters_with_optimizer);
  for (size_t c = 0; c < in->elements.size(); ++c) {
    EXPECT_EQ(in->param_bytes(c), 2 * static_cast<uint64_t>(in->elements[c]));
    EXPECT_EQ(in->optimizer_bytes(c), 6 * in->param_bytes(c));
  }
  // Two tensor ranks hold about half each.
  const JobSpec halves = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\nparallel: {tensor: 2}");
  in = RankTierInput(halves);
  ASSERT_TRUE(in.ok());
  // Each rank draws the whole of a shard's tensor first (its share of the
  // vocabulary, rounded down, times the ranks): the token embedding.
  EXPECT_LE(in->init_scratch_bytes, 4u * static_cast<uint64_t>(config.vocab_size * config.hidden));
  EXPECT_GT(in->init_scratch_bytes, 4u * static_cast<uint64_t>(config.vocab_size * config.hidden) * 99 / 100);
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

TEST(SpecValidatorTest, GradientAccumulationSplitsTheBatch) {
  JobSpec spec = Resolved("data: {synthetic: {}}");
  EXPECT_EQ(spec.train().grad_accum_steps(), 1u) << "no accumulation by default";
  EXPECT_EQ(ToTrainOptions(spec.train()).grad_accum_steps, 1);
  JobSpec four = Resolved("data: {synthetic: {}}\ntrain: {batch_size: 8, grad_accum_steps: 4}");
  EXPECT_TRUE(ValidateSpec(four, Machine()).ok());
  EXPECT_EQ(ToTrainOptions(four.train()).grad_accum_steps, 4);
  auto check = [&](const std::string& yaml) { return ValidateSpec(Resolved(yaml), Machine()); };
  EXPECT_TRUE(check("data: {synthetic: {}}\ntrain: {batch_size: 8, grad_accum_steps: 2}\nparallel: {data: 2}").ok());
  absl::Status odd = check("data: {synthetic: {}}\ntrain: {batch_size: 8, grad_accum_steps: 3}");
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("train.grad_accum_steps: 3 micro-batches do not split train.batch_size 8"),
            std::string::npos)
      << odd;
  absl::Status ranks = check("data: {synthetic: {}}\ntrain: {batch_size: 8, grad_accum_steps: 4}\nparallel: {data: 4}");
  EXPECT_EQ(ranks.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ranks.message().find("train.batch_size: 8 does not split into 4 micro-batches (train.grad_accum_steps) "
                                 "on each of 4 data-parallel ranks; use a multiple of 16"),
            std::string::npos)
      << ranks;
}

TEST(SpecValidatorTest, MixedPrecisionAndItsLossScale) {
  for (const char* precision : {"fp16", "bf16"}) {
    JobSpec spec = Resolved(std::string("data: {synthetic: {}}\ntrain: {precision: ") + precision + "}");
    EXPECT_TRUE(ValidateSpec(spec, Machine()).ok()) << precision;
    EXPECT_EQ(spec.train().loss_scale(), 65536.0);
    EXPECT_EQ(spec.train().loss_scale_growth_interval(), 1000u);
    EXPECT_TRUE(spec.train().overlap_optimizer()) << "the optimizer overlaps by default";
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

TEST_F(AllowedRootsValidationTest, HeldOutDataIsCheckedLikeTrainingData) {
  const std::string data = "model: {preset: gpt2-tiny, seq_len: 32}\ndata: {path: " + root_ + "/t.bin";
  // 1000 tokens: a tenth held out leaves a window of 33 on either side.
  EXPECT_TRUE(Validate(data + ", eval: {held_out_fraction: 0.1}}").ok()) << Validate(data + ", eval: {held_out_fraction: 0.1}}");
  absl::Status s = Validate(data + ", eval: {held_out_fraction: 0.01}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("data.eval.held_out_fraction: 0.01 of data.path's 1000 tokens leaves 10 held out"),
            std::string::npos)
      << s;
  s = Validate(data + ", eval: {held_out_fraction: 0.7}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("data.eval.held_out_fraction: 0.7 must be above 0 and at most 0.5"), std::string::npos) << s;
  EXPECT_TRUE(Validate(data + ", eval: {path: " + root_ + "/t.bin}}").ok());
  s = Validate(data + ", eval: {path: " + outside_ + "/t.bin}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("data.eval.path: " + outside_ + "/t.bin is outside the allowed roots"), std::string::npos)
      << s;
  s = Validate(data + ", eval: {path: " + root_ + "/none.bin}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("data.eval.path: " + root_ + "/none.bin does not exist"), std::string::npos) << s;
  s = Validate(data + "}\ntrain: {eval_every_steps: 10}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("train.eval_every_steps: 10 but there is no held-out data"), std::string::npos) << s;
  s = Validate("data: {synthetic: {}, eval: {held_out_fraction: 0.1}}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("synthetic data is evaluated on fresh sequences"), std::string::npos) << s;
  EXPECT_TRUE(Validate("data: {synthetic: {}}\ntrain: {eval_every_steps: 10}").ok());
  s = Validate("data: {synthetic: {}}\ntrain: {eval_batches: 5000}");
  EXPECT_NE(s.message().find("train.eval_batches"), std::string::npos) << s;
  // Defaults: with eval data, a tenth of the steps; four batches.
  const ferry::v1::JobSpec spec = Resolved(data + ", eval: {held_out_fraction: 0.1}}\ntrain: {steps: 250}");
  EXPECT_EQ(spec.train().eval_every_steps(), 25u);
  EXPECT_EQ(spec.train().eval_batches(), 4u);
  EXPECT_EQ(Resolved("data: {synthetic: {}}").train().eval_every_steps(), 0u) << "no eval data, no evaluation";
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

TEST_F(AllowedRootsValidationTest, TheDiskDirectoryIsConfinedLikeCheckpoints) {
  // Inside: an existing directory, and one to be created.
  std::string yaml = "data: {synthetic: {}}\nmemory: {disk_dir: " + root_ + "}";
  EXPECT_TRUE(Validate(yaml).ok()) << Validate(yaml);
  yaml = "data: {synthetic: {}}\nmemory: {disk_dir: " + root_ + "/new/scratch}";
  EXPECT_TRUE(Validate(yaml).ok()) << Validate(yaml);
  // Outside, directly or through a link.
  absl::Status s = Validate("data: {synthetic: {}}\nmemory: {disk_dir: " + outside_ + "}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("memory.disk_dir: " + outside_ + " is outside the allowed roots"), std::string::npos) << s;
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/scratch").c_str()), 0);
  s = Validate("data: {synthetic: {}}\nmemory: {disk_dir: " + root_ + "/scratch/ferry}");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("memory.disk_dir: " + root_ + "/scratch/ferry resolves to " + outside_ + "/ferry"),
            std::string::npos)
      << s;
  // A file where the directory must be.
  s = Validate("data: {synthetic: {}}\nmemory: {disk_dir: " + root_ + "/t.bin}");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("memory.disk_dir"), std::string::npos) << s;
  EXPECT_NE(s.message().find("is not a directory"), std::string::npos) << s;
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

// A size a job file cannot say (over 2^63 bytes; an API client can send
// one) is refused, so that every accepted spec reads back from its JSON
// form (found by job_spec_proto_fuzzer: a device budget of 2^63 + 2^35).
TEST(SpecLimitsTest, SizesBeyondWhatAJobFileCanSayAreRefused) {
  for (const char* field : {"device_budget", "host_budget", "chunk_size", "disk_budget"}) {
    SCOPED_TRACE(field);
    JobSpec spec = Resolved("data: {synthetic: {}}");
    auto* m = spec.mutable_memory();
    const uint64_t huge = (uint64_t{1} << 63) + (uint64_t{1} << 35);
    const std::string name = field;
    if (name == "device_budget") m->set_device_budget(huge);
    if (name == "host_budget") m->set_host_budget(huge);
    if (name == "chunk_size") m->set_chunk_size(huge);
    if (name == "disk_budget") m->set_disk_budget(huge);
    MachineFacts machine = Machine();
    machine.host_memory_bytes = 0;  // the checks against a machine's memory do not run
    const absl::Status s = ValidateSpec(spec, machine);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(absl::StrCat("memory.", field, ": ", huge, " bytes is beyond any machine")),
              std::string::npos)
        << s;
  }
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
  // The simulated device's budget is host memory: gpt2-xl (23 GiB of
  // state, all of it on the host side) fits the 24 GiB model data may have
  // of 32 GiB with a GPU, not the 12.75 GiB a 15 GiB simulated device
  // leaves.
  const std::string xl = "data: {synthetic: {}}\nmodel: {preset: gpt2-xl}\nmemory: {device_budget: 15GiB}";
  simulated.host_memory_bytes = 32 * kGiB;
  s = ValidateSpec(Resolved(xl), simulated);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("the simulated device's memory is host memory too"), std::string::npos) << s;
  gpu.device_memory_bytes = 16 * kGiB;
  gpu.host_memory_bytes = 32 * kGiB;
  EXPECT_TRUE(ValidateSpec(Resolved(xl), gpu).ok()) << ValidateSpec(Resolved(xl), gpu);
}

TEST(SpecLimitsTest, ReplicasCountOnOneMachineAndCheckpointsTakeNoMemoryBesideTheBudget) {
  // gpt2-small: about 124M parameters, 1.85 GiB of training state, all on
  // the host side (no disk tier here). On the simulated device (a quarter
  // of host memory), model data may have 3/4 of the rest by default:
  // 1.5 x the state with this much memory.
  const JobSpec small = Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}");
  const uint64_t state = TrainingStateBytes(small.model());
  MachineFacts machine = Machine();
  machine.host_memory_bytes = state * 8 / 3;
  machine.device_is_host_memory = true;
  EXPECT_TRUE(ValidateSpec(small, machine).ok()) << ValidateSpec(small, machine);
  // Checkpoints need no memory beside the budget: where a snapshot does
  // not fit, the state streams to its file.
  absl::Status s = ValidateSpec(
      Resolved("data: {synthetic: {}}\nmodel: {preset: gpt2-small}\ncheckpoint: {dir: /nonexistent/ckpt}"),
      [&] {
        MachineFacts m = machine;
        m.check_files = false;
        return m;
      }());
  EXPECT_TRUE(s.ok()) << s;
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

// A GPT-2 weights file of 2 blocks, hidden 32, vocabulary 64, context 16,
// written into `dir` (with n_head in its metadata when `heads` > 0).
std::string WeightsFile(const std::string& dir, int64_t heads, int layers = 2) {
  ModelConfig c;
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  c.vocab_size = 64;
  c.seq_len = 16;
  std::vector<SafetensorsTensor> tensors;
  for (const Gpt2Tensor& t : Gpt2Tensors(c)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    tensors.push_back({t.name, "F16", t.shape, std::string(static_cast<size_t>(n) * 2, '\0')});
  }
  std::map<std::string, std::string> metadata;
  if (heads > 0) metadata["n_head"] = std::to_string(heads);
  std::string bytes;
  EXPECT_TRUE(SerializeSafetensors(tensors, metadata, &bytes).ok());
  const std::string path = dir + "/model.safetensors";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST_F(AllowedRootsValidationTest, TheModelIsReadFromItsWeights) {
  const std::string path = WeightsFile(root_, 4);
  JobSpec spec = Resolved("model: {init_from: " + path + "}\ndata: {synthetic: {}}");
  EXPECT_EQ(spec.model().layers(), 0u) << "left to the file";
  EXPECT_EQ(spec.model().dropout(), 0.1);
  // The CLI's own checks leave it to the daemon.
  MachineFacts local = Machine();
  local.check_files = false;
  EXPECT_TRUE(ValidateSpec(spec, local).ok()) << ValidateSpec(spec, local);
  ASSERT_TRUE(ResolveModelFromWeights(&spec, machine_).ok());
  EXPECT_EQ(spec.model().layers(), 2u);
  EXPECT_EQ(spec.model().hidden(), 32u);
  EXPECT_EQ(spec.model().heads(), 4u);
  EXPECT_EQ(spec.model().vocab_size(), 64u);
  EXPECT_EQ(spec.model().seq_len(), 16u);
  EXPECT_TRUE(ValidateSpec(spec, machine_).ok()) << ValidateSpec(spec, machine_);
  // Unresolved, the daemon's checks refuse it.
  EXPECT_EQ(ValidateSpec(Resolved("model: {init_from: " + path + "}\ndata: {synthetic: {}}"), machine_).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(AllowedRootsValidationTest, WeightsThatAreNotTheModelAreRefusedAtSubmit) {
  const std::string path = WeightsFile(root_, 0);
  // Without n_head, and no config.json: heads must be given.
  JobSpec bare = Resolved("model: {init_from: " + path + "}\ndata: {synthetic: {}}");
  absl::Status s = ResolveModelFromWeights(&bare, machine_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("set model.heads"), std::string::npos) << s;
  JobSpec heads = Resolved("model: {init_from: " + path + ", heads: 8}\ndata: {synthetic: {}}");
  ASSERT_TRUE(ResolveModelFromWeights(&heads, machine_).ok());
  EXPECT_EQ(heads.model().heads(), 8u);
  // A field set otherwise than the file: refused naming the tensor and both shapes.
  JobSpec deeper = Resolved("model: {init_from: " + path + ", layers: 3, heads: 4}\ndata: {synthetic: {}}");
  ASSERT_TRUE(ResolveModelFromWeights(&deeper, machine_).ok());
  s = ValidateSpec(deeper, machine_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("has no h.2.ln_1.weight ([32] for this model)"), std::string::npos) << s;
  JobSpec wider = Resolved("model: {init_from: " + path + ", hidden: 64, heads: 4}\ndata: {synthetic: {}}");
  ASSERT_TRUE(ResolveModelFromWeights(&wider, machine_).ok());
  s = ValidateSpec(wider, machine_);
  EXPECT_NE(s.message().find("wte.weight is [64, 32] in the file but [64, 64] in this model"), std::string::npos)
      << s;
  // A damaged file, one that is not there, one outside the roots.
  std::ofstream(root_ + "/cut.safetensors", std::ios::binary) << std::string("\xff\xff\0\0\0\0\0\0{}", 10);
  JobSpec cut = Resolved("model: {init_from: " + root_ + "/cut.safetensors}\ndata: {synthetic: {}}");
  s = ResolveModelFromWeights(&cut, machine_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the header claims 65535 bytes but the file holds 2"), std::string::npos) << s;
  JobSpec absent = Resolved("model: {init_from: " + root_ + "/absent.safetensors}\ndata: {synthetic: {}}");
  EXPECT_EQ(ResolveModelFromWeights(&absent, machine_).code(), absl::StatusCode::kFailedPrecondition);
  const std::string outside = WeightsFile(outside_, 4);
  JobSpec away = Resolved("model: {init_from: " + outside + "}\ndata: {synthetic: {}}");
  EXPECT_EQ(ResolveModelFromWeights(&away, machine_).code(), absl::StatusCode::kPermissionDenied);
}

// A Llama-family model folder: config.json and its weights (zeros), in
// one file or two shards with their index.
std::string LlamaFolder(const std::string& root, const std::string& name, const std::string& config_json,
                        bool sharded) {
  const std::string dir = root + "/" + name;
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
  std::ofstream(dir + "/config.json") << config_json;
  absl::StatusOr<HfConfig> config = ParseHfConfig(config_json, "config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  std::vector<SafetensorsTensor> tensors;
  for (const HfTensor& t : HfTensors(config->model)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    tensors.push_back({t.name, "BF16", t.shape, std::string(static_cast<size_t>(n) * 2, '\0')});
  }
  auto write = [&](const std::string& file, std::vector<SafetensorsTensor> part) {
    std::string bytes;
    EXPECT_TRUE(SerializeSafetensors(part, {}, &bytes).ok());
    std::ofstream(dir + "/" + file, std::ios::binary) << bytes;
  };
  if (!sharded) {
    write("model.safetensors", tensors);
    return dir;
  }
  const size_t half = tensors.size() / 2;
  std::string index = R"({"metadata": {}, "weight_map": {)";
  for (size_t i = 0; i < tensors.size(); ++i) {
    index += (i ? ", \"" : "\"") + tensors[i].name + "\": \"model-0000" + (i < half ? "1" : "2") +
             "-of-00002.safetensors\"";
  }
  index += "}}";
  std::ofstream(dir + "/model.safetensors.index.json") << index;
  write("model-00001-of-00002.safetensors", {tensors.begin(), tensors.begin() + static_cast<long>(half)});
  write("model-00002-of-00002.safetensors", {tensors.begin() + static_cast<long>(half), tensors.end()});
  return dir;
}

constexpr char kTinyLlama[] = R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300,
  "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 64}, "eos_token_id": [2, 3]})";

TEST(SpecDefaultsTest, LlamaFamilyPresetsRecordTheirArchitecture) {
  const JobSpec spec = Resolved("model: {preset: llama-3.2-1b, seq_len: 512}\ndata: {synthetic: {}}");
  EXPECT_EQ(spec.model().layers(), 16u);
  EXPECT_EQ(spec.model().architecture().model_type(), "llama");
  EXPECT_EQ(spec.model().architecture().kv_heads(), 8u);
  EXPECT_EQ(spec.model().architecture().rope_scaling(), "llama3");
  EXPECT_EQ(spec.model().dropout(), 0.0);
  const ModelConfig c = ToModelConfig(spec.model());
  EXPECT_EQ(c.seq_len, 512);
  const ModelConfig preset = *ModelPreset("llama-3.2-1b");
  EXPECT_EQ(c.ParameterCount(), preset.ParameterCount());
  EXPECT_TRUE(c.Rotary());
  EXPECT_TRUE(c.Gated());
  EXPECT_TRUE(c.tied);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  // Through its JSON form (the store's) and back: the same model.
  const ModelConfig again = ToModelConfig(Resolved("model: {preset: qwen3-0.6b}\ndata: {synthetic: {}}").model());
  EXPECT_TRUE(again.qk_norm);
  EXPECT_EQ(again.HeadDim(), 128);
  EXPECT_EQ(again.ParameterCount(), ModelPreset("qwen3-0.6b")->ParameterCount());
  const JobSpec tiny = Resolved("model: {preset: llama-tiny}\ndata: {synthetic: {}}");
  EXPECT_TRUE(ValidateSpec(tiny, Machine()).ok()) << ValidateSpec(tiny, Machine());
  // A job file's own architecture fields win over the preset's.
  const JobSpec narrower =
      Resolved("model: {preset: llama-tiny, architecture: {intermediate: 128}}\ndata: {synthetic: {}}");
  EXPECT_EQ(ToModelConfig(narrower.model()).Intermediate(), 128);
  EXPECT_FALSE(ToModelConfig(narrower.model()).tied) << "the preset's";
}

TEST(SpecValidatorTest, LlamaFamilyShapesAreChecked) {
  // Beyond the model's positions; tensor ranks that do not divide the
  // key/value heads; an unknown family.
  ExpectProblem("model: {preset: llama-tiny, seq_len: 2048}\ndata: {synthetic: {}}",
                absl::StatusCode::kInvalidArgument, "model.seq_len: 2048 is beyond the 1024 positions");
  ExpectProblem("model: {preset: llama-tiny}\nparallel: {tensor: 4}\ndata: {synthetic: {}}",
                absl::StatusCode::kInvalidArgument, "parallel.tensor: 4 ranks cannot split model.kv_heads (2)");
  ExpectProblem("model: {preset: llama-tiny, architecture: {model_type: falcon}}\ndata: {synthetic: {}}",
                absl::StatusCode::kInvalidArgument, "model.architecture.model_type: unknown model_type \"falcon\"");
  ExpectProblem("model: {preset: llama-tiny, architecture: {model_type: llama, kv_heads: 3}}\ndata: {synthetic: {}}",
                absl::StatusCode::kInvalidArgument, "model.kv_heads: 3 does not divide model.heads (4)");
  ExpectProblem("model: {preset: llama-tiny, architecture: {head_dim: 100000}}\ndata: {synthetic: {}}",
                absl::StatusCode::kInvalidArgument, "model.architecture.head_dim");
  ExpectProblem("model: {preset: llama-tiny, architecture: {norm_eps: 2}}\ndata: {synthetic: {}}",
                absl::StatusCode::kInvalidArgument, "model.architecture.norm_eps: 2 is out of range");
  EXPECT_TRUE(ValidateSpec(Resolved("model: {preset: llama-tiny}\nparallel: {tensor: 2}\ndata: {synthetic: {}}"),
                           Machine())
                  .ok());
}

TEST_F(AllowedRootsValidationTest, AModelFolderGivesTheModel) {
  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "one file");
    const std::string dir = LlamaFolder(root_, sharded ? "sharded" : "single", kTinyLlama, sharded);
    JobSpec spec = Resolved("model: {init_from: " + dir + "}\ndata: {synthetic: {}}");
    EXPECT_EQ(spec.model().dropout(), 0.0) << "no dropout by default for a folder";
    ASSERT_TRUE(ResolveModelFromWeights(&spec, machine_).ok()) << ResolveModelFromWeights(&spec, machine_);
    EXPECT_EQ(spec.model().layers(), 2u);
    EXPECT_EQ(spec.model().seq_len(), 512u) << "the model's positions, at most 2048";
    EXPECT_EQ(spec.model().architecture().model_type(), "llama");
    EXPECT_TRUE(spec.model().architecture().untied());
    EXPECT_TRUE(ValidateSpec(spec, machine_).ok()) << ValidateSpec(spec, machine_);
    // Resolving again changes nothing.
    JobSpec again = spec;
    ASSERT_TRUE(ResolveModelFromWeights(&again, machine_).ok());
    EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
  }
}

TEST_F(AllowedRootsValidationTest, BrokenModelFoldersAreRefusedAtSubmit) {
  auto refused = [&](const std::string& dir, absl::StatusCode code, const std::string& says,
                     const std::string& extra = "") {
    JobSpec spec = Resolved("model: {init_from: " + dir + extra + "}\ndata: {synthetic: {}}");
    absl::Status s = ResolveModelFromWeights(&spec, machine_);
    if (s.ok()) s = ValidateSpec(spec, machine_);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << "'" << s.message() << "' lacks '" << says << "'";
  };
  std::string config = kTinyLlama;
  const std::string mixtral = LlamaFolder(root_, "mixtral", config, false);
  std::ofstream(mixtral + "/config.json") << R"({"model_type": "mixtral", "num_local_experts": 8})";
  refused(mixtral, absl::StatusCode::kInvalidArgument, "model_type \"mixtral\" is not one Ferry implements");

  const std::string missing = LlamaFolder(root_, "missing", config, true);
  std::remove((missing + "/model-00002-of-00002.safetensors").c_str());
  refused(missing, absl::StatusCode::kInvalidArgument, "names the shard model-00002-of-00002.safetensors");

  const std::string deeper = LlamaFolder(root_, "deeper", config, false);
  refused(deeper, absl::StatusCode::kInvalidArgument,
          "has no model.layers.2.input_layernorm.weight", ", layers: 3");

  std::string windowed = kTinyLlama;
  windowed.replace(windowed.find("\"llama\""), 7, "\"mistral\"");
  windowed.insert(1, "\"sliding_window\": 128, ");
  const std::string mistral = LlamaFolder(root_, "mistral", windowed, false);
  refused(mistral, absl::StatusCode::kInvalidArgument, "model.seq_len: 512 is longer than the model's sliding");

  const std::string empty = root_ + "/empty";
  ASSERT_EQ(mkdir(empty.c_str(), 0755), 0);
  refused(empty, absl::StatusCode::kFailedPrecondition, "has no config.json");

  const std::string away = LlamaFolder(outside_, "away", config, false);
  refused(away, absl::StatusCode::kPermissionDenied, "model.init_from");
}

}  // namespace
}  // namespace ferry
