#include "server/spec/job_file.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

using ferry::v1::JobSpec;

// The example from the job file documentation.
constexpr char kExample[] = R"(
name: tiny
model: {preset: gpt2-tiny}          # or layers, hidden, heads, vocab_size, seq_len, dropout
data: {synthetic: {}}               # or {path: tokens.bin}
train: {steps: 200, batch_size: 8, lr: 3.0e-3, seed: 1, precision: fp32}
memory: {policy: auto, device_budget: 512MiB, host_budget: 4GiB}
parallel: {tensor: 1, data: 1}
checkpoint: {dir: ckpt, every_steps: 100, keep: 2}
)";

TEST(JobFileTest, ParsesTheDocumentedExample) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kExample, "/jobs");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "tiny");
  EXPECT_EQ(spec->model().preset(), "gpt2-tiny");
  EXPECT_TRUE(spec->data().has_synthetic());
  EXPECT_EQ(spec->train().steps(), 200u);
  EXPECT_DOUBLE_EQ(spec->train().lr(), 3e-3);
  EXPECT_EQ(spec->train().precision(), ferry::v1::PRECISION_FP32);
  EXPECT_EQ(spec->memory().policy(), ferry::v1::MEMORY_POLICY_AUTO);
  EXPECT_EQ(spec->memory().device_budget(), 512ull << 20);
  EXPECT_EQ(spec->memory().host_budget(), 4ull << 30);
  EXPECT_EQ(spec->parallel().tensor(), 1u);
  // Relative paths resolve against the job file's directory.
  EXPECT_EQ(spec->checkpoint().dir(), "/jobs/ckpt");
  EXPECT_EQ(spec->checkpoint().keep(), 2u);
}

TEST(JobFileTest, TheDiskTierDirectoryIsAPathAndItsBudgetASize) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec("data: {synthetic: {}}\nmemory: {disk_dir: scratch/ferry, disk_budget: 200GiB}", "/jobs");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->memory().disk_dir(), "/jobs/scratch/ferry");
  EXPECT_EQ(spec->memory().disk_budget(), 200ull << 30);
}

TEST(JobFileTest, AcceptsJsonAndCamelCaseNames) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      R"({"model": {"vocabSize": 300, "seqLen": 64}, "data": {"path": "/d/t.bin"},
          "train": {"batchSize": 4, "precision": "PRECISION_FP32"}})",
      "/x");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().vocab_size(), 300u);
  EXPECT_EQ(spec->model().seq_len(), 64u);
  EXPECT_EQ(spec->train().batch_size(), 4u);
  EXPECT_EQ(spec->data().path(), "/d/t.bin");
}

void ExpectError(const std::string& yaml, const std::string& needle) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "/x");
  ASSERT_FALSE(spec.ok()) << yaml;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_NE(spec.status().message().find(needle), std::string::npos)
      << "'" << spec.status().message() << "' lacks '" << needle << "'";
}

TEST(JobFileTest, ErrorsNameTheFieldAndTheFix) {
  ExpectError("model: {layer: 3}", "model: unknown field 'layer'; did you mean 'layers'?");
  ExpectError("modle: {}", "did you mean 'model'?");
  ExpectError("model: {layers: three}", "model.layers: expected a whole number");
  ExpectError("model: {layers: -2}", "model.layers: must not be negative");
  ExpectError("model: {layers: 99999999999}", "model.layers");
  ExpectError("model: 7", "model: expected a mapping");
  ExpectError("train: {precision: fp8}", "train.precision: 'fp8' is not one of fp32, fp16, bf16");
  ExpectError("memory: {device_budget: 12 bananas}", "memory.device_budget: '12 bananas' is not a size");
  ExpectError("data: {path: a.bin, synthetic: {}}", "data: set only one of path and synthetic");
  ExpectError("train: {lr: fast}", "train.lr: expected a number");
  ExpectError("name: [a, b]", "name: expected a single value, got a list");
  ExpectError("model: {preset: gpt2-tiny", "not valid YAML: line 1");
  ExpectError("- a\n- b", "a job file is a mapping");
}

TEST(JobFileTest, SizesAreOnlyAcceptedForSizeFields) {
  ExpectError("train: {steps: 10MiB}", "train.steps: expected a whole number");
  // Numbers no integer holds: refused, not converted (undefined behaviour).
  ExpectError("model: {layers: 1e300}", "model.layers: expected a whole number in range");
  ExpectError("model: {layers: .nan}", "model.layers: expected a whole number");
  ExpectError("train: {steps: -.inf}", "train.steps: must not be negative");
  ExpectError("train: {seed: 1.5}", "train.seed: expected a whole number");
  absl::StatusOr<JobSpec> spec = ParseJobSpec("memory: {host_budget: 1073741824}", "/x");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->memory().host_budget(), 1ull << 30);
}

TEST(JobFileTest, OverridesReplaceValuesAndOneofSiblings) {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(kExample, "/jobs", {"train.steps=7", "data.path=tok.bin", "model.dropout=0.2"},
                   "/home/me");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().steps(), 7u);
  EXPECT_FALSE(spec->data().has_synthetic());
  // A relative path on the command line resolves against the current directory.
  EXPECT_EQ(spec->data().path(), "/home/me/tok.bin");
  EXPECT_TRUE(spec->model().has_dropout());
  EXPECT_DOUBLE_EQ(spec->model().dropout(), 0.2);
  EXPECT_EQ(spec->checkpoint().dir(), "/jobs/ckpt");
}

TEST(JobFileTest, OverrideCanSetWholeGroupsAndRejectsUnknownFields) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec("data: {path: x.bin}", "/d", {"data={synthetic: {branching: 3}}"}, "/c");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().synthetic().branching(), 3u);

  spec = ParseJobSpec("", "/d", {"train.stepz=3"}, "/c");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("did you mean 'steps'"), std::string::npos);

  spec = ParseJobSpec("", "/d", {"train.steps"}, "/c");
  EXPECT_NE(spec.status().message().find("FIELD=VALUE"), std::string::npos);

  spec = ParseJobSpec("", "/d", {"name.first=3"}, "/c");
  EXPECT_NE(spec.status().message().find("name: is not a group of fields"), std::string::npos);
}

// Found by //tests/fuzz:job_spec_yaml_fuzzer: a string that is not UTF-8
// was accepted, though protobuf refuses to send it (the CLI's Submit failed
// with an internal error, and the JSON form read back changed).
TEST(JobFileTest, RefusesStringsThatAreNotUtf8) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec("name: \"t\xa4\"\ndata: {path: \"/d/t.\xa4" "bin\"}", "/x");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("name: is not valid UTF-8"), std::string::npos) << spec.status();
  for (const char* bad : {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80"}) {
    spec = ParseJobSpec("", "/x", {std::string("name=\"") + bad + "\""}, "/c");
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  spec = ParseJobSpec("name: \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x82\"", "/x");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x82");
}

TEST(JobFileTest, MissingFileIsNotFound) {
  absl::StatusOr<JobSpec> spec = LoadJobFile("/nonexistent/job.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find("/nonexistent/job.yaml"), std::string::npos);
}

}  // namespace
}  // namespace ferry
