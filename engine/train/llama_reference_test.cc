// The Llama family trains as an independent implementation does:
// llama_reference.py builds each variant in plain PyTorch with Hugging
// Face's parameter names (nothing of Ferry's), writes its random initial
// weights as a Hugging Face model folder (config.json and safetensors, one
// file or sharded with an index) and trains them with torch.optim.AdamW on
// one fixed batch. Ferry reads the folder's config.json (ParseHfConfig)
// and weights (model.init_from) and must give the same losses and gradient
// norms: with chunks streamed to a device too small for the model, with the
// optimizer states on the disk tier, with two tensor-parallel ranks, with
// two fully sharded data ranks, and in bf16 within its rounding.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/test_files.h"
#include "engine/data/token_file_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/hf_layout.h"
#include "engine/parallel/communicator.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

constexpr int64_t kSeqLen = 32;
constexpr int kSteps = 6;

// One variant of the family: what the script is told to build.
struct Variant {
  const char* name;
  const char* args;
};
const Variant kVariants[] = {
    // Grouped queries (2 key/value heads for 4), Llama 3.1's rope scaling,
    // an untied output layer; weights in two shards.
    {"llama", "--model_type llama --kv_heads 2 --llama3_factor 8 --llama3_original 64 --rope_theta 500000 --shards 2"},
    // Tied, biased q/k/v.
    {"qwen2", "--model_type qwen2 --kv_heads 2 --tied --rope_theta 1000000 --eps 1e-6"},
    // Per-head q/k norms; heads x head_dim (4 x 24) wider than hidden (64).
    {"qwen3", "--model_type qwen3 --kv_heads 2 --head_dim 24 --tied --eps 1e-6"},
    // One key/value head for all four query heads.
    {"mistral", "--model_type mistral --kv_heads 1"},
};

TrainOptions Options(TrainOptions::Precision precision) {
  TrainOptions o;
  o.steps = kSteps;
  o.batch_size = 2;  // both rows are the file's one window
  o.lr = 3e-3;
  o.min_lr = o.lr;
  o.warmup_steps = 0;
  o.weight_decay = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.grad_clip = 1.0;
  o.threads = 1;
  o.seed = 5;
  o.precision = precision;
  return o;
}

// What the reference computed for one variant, and the model its folder
// describes.
struct Reference {
  std::string dir;
  ModelConfig model;
  std::vector<double> losses;
  std::vector<double> grad_norms;
};

// Runs the script once for each variant.
const Reference& ReferenceOf(const Variant& v) {
  static auto* references = new std::map<std::string, std::unique_ptr<Reference>>;
  std::unique_ptr<Reference>& r = (*references)[v.name];
  if (r != nullptr) return *r;
  r = std::make_unique<Reference>();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const char* runfiles = std::getenv("TEST_SRCDIR");
  r->dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/llama_reference_", v.name);
  const std::string script =
      std::string(runfiles != nullptr ? runfiles : ".") + "/ferry/engine/train/llama_reference.py";
  const std::string command = absl::StrCat("/usr/bin/python3 ", script, " ", r->dir, " ", v.args, " --seq_len ",
                                           kSeqLen, " --steps ", kSteps, " >", r->dir, ".log 2>&1");
  if (std::system(command.c_str()) != 0) {
    std::ifstream log(r->dir + ".log");
    ADD_FAILURE() << command << " failed (python3-torch is installed by tools/install_deps.sh):\n"
                  << std::string(std::istreambuf_iterator<char>(log), {});
    return *r;
  }
  std::ifstream config(r->dir + "/config.json");
  std::stringstream text;
  text << config.rdbuf();
  absl::StatusOr<HfConfig> parsed = ParseHfConfig(text.str(), r->dir + "/config.json");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (parsed.ok()) {
    r->model = parsed->model;
    r->model.seq_len = kSeqLen;
  }
  std::ifstream in(r->dir + "/reference.txt");
  std::string kind;
  size_t k;
  double value;
  while (in >> kind >> k >> value) {
    std::vector<double>& into = kind == "loss" ? r->losses : r->grad_norms;
    if (into.size() <= k) into.resize(k + 1);
    into[k] = value;
  }
  return *r;
}

class Recording : public TrainingObserver {
 public:
  void OnStep(const StepReport& r) override { reports.push_back(r); }
  std::vector<StepReport> reports;
};

// Every parameter chunk streamed from the host each step.
MemoryOptions Streamed() {
  MemoryOptions m;
  m.policy = MemoryOptions::Policy::kStatic;
  m.static_param_host_fraction = 1.0;
  m.static_optimizer_host_fraction = 1.0;
  m.chunk_elements = 16384;  // several chunks
  return m;
}

struct Trained {
  absl::Status status;
  std::vector<StepReport> reports;  // rank 0's
};

// Trains from the variant's folder with `tensor` x `data` ranks as threads.
Trained Train(const Reference& ref, const TrainOptions& options, std::optional<MemoryOptions> memory, int tensor = 1,
              int data = 1, uint64_t device_bytes = uint64_t{1} << 20, const std::string& folder = "") {
  const int world = tensor * data;
  SimulatedDevice device(device_bytes * static_cast<uint64_t>(world));
  std::vector<absl::Status> status(static_cast<size_t>(world));
  std::vector<std::vector<StepReport>> reports(static_cast<size_t>(world));
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  auto rank = [&](int r) {
    const size_t i = static_cast<size_t>(r);
    std::optional<ParallelGroups> groups;
    if (world > 1) {
      CommunicatorOptions comm;
      comm.timeout = std::chrono::seconds(60);
      absl::StatusOr<ParallelGroups> joined = JoinParallelGroups(store, r, tensor, data, comm);
      if (!joined.ok()) {
        status[i] = joined.status();
        return;
      }
      groups = std::move(*joined);
    }
    absl::StatusOr<std::unique_ptr<TokenFileSource>> source =
        TokenFileSource::Open(ref.dir + "/tokens.bin", ref.model.vocab_size, kSeqLen + 1, 1);
    if (!source.ok()) {
      status[i] = source.status();
      return;
    }
    EngineOptions engine;
    engine.device = &device;
    engine.memory = memory;
    engine.tensor = groups ? groups->tensor.get() : nullptr;
    engine.data = groups ? groups->data.get() : nullptr;
    engine.init_from = folder.empty() ? ref.dir : folder;
    Recording observer;
    status[i] = Trainer(ref.model, options, engine, std::move(*source), &observer).Run();
    reports[i] = observer.reports;
    if (groups) {
      const absl::Status finished = FinishParallelGroups(*groups);
      if (status[i].ok()) status[i] = finished;
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(rank, r);
  for (std::thread& t : threads) t.join();
  Trained run;
  for (const absl::Status& s : status) run.status.Update(s);
  run.reports = reports[0];
  return run;
}

// Step k's report holds the loss before its update: the reference's k - 1.
void ExpectReference(const Reference& ref, const Trained& run, double first, double after, double norms) {
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps + 1));
  ASSERT_EQ(run.reports.size(), static_cast<size_t>(kSteps));
  std::ostringstream figures;
  figures.precision(9);
  for (size_t k = 0; k < run.reports.size(); ++k) {
    figures << " " << run.reports[k].loss << " (" << ref.losses[k] << ")";
    EXPECT_NEAR(run.reports[k].loss, ref.losses[k], k == 0 ? first : after) << "after " << k << " updates";
    EXPECT_NEAR(run.reports[k].grad_norm, ref.grad_norms[k], norms * ref.grad_norms[k]) << "step " << k + 1;
  }
  std::cout << "losses" << figures.str() << "\n";
}

class LlamaReferenceTest : public ::testing::TestWithParam<Variant> {};

// The model's fp32 data is about 1 MB with the optimizer's; the device
// holds a fraction of it, so chunks move every step.
TEST_P(LlamaReferenceTest, ChunkedFp32TrainsAsThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  ASSERT_FALSE(ref.losses.empty());
  const Trained run = Train(ref, Options(TrainOptions::Precision::kFp32), Streamed());
  ExpectReference(ref, run, 1e-5, 1e-4, 1e-4);
  uint64_t moved = 0;
  for (const StepReport& r : run.reports) moved += r.memory_stats.host_to_device_bytes;
  EXPECT_GT(moved, 0u) << "chunks moved to the device";
}

TEST_P(LlamaReferenceTest, PlainLoopTrainsAsThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  ExpectReference(ref, Train(ref, Options(TrainOptions::Precision::kFp32), std::nullopt, 1, 1, uint64_t{1} << 30),
                  1e-5, 1e-4, 1e-4);
}

// The optimizer states and the weights' host copies beyond a small host
// budget live on the disk tier.
TEST_P(LlamaReferenceTest, DiskTierTrainsAsThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  MemoryOptions memory = Streamed();
  memory.chunk_elements = 4096;  // small staging buffers
  // Room for the weights and little more: the gradients and optimizer
  // states (12 of the 16 bytes a parameter) go to disk.
  memory.host_budget_bytes = 4 * static_cast<uint64_t>(ref.model.ParameterCount()) + (900 << 10);
  memory.disk_dir = testing::EmptyTestPath(absl::StrCat("llama-disk-", GetParam().name));
  memory.disk_budget_bytes = uint64_t{1} << 30;
  const Trained run = Train(ref, Options(TrainOptions::Precision::kFp32), memory);
  ExpectReference(ref, run, 1e-5, 1e-4, 1e-4);
  uint64_t read = 0;
  for (const StepReport& r : run.reports) read += r.memory_stats.disk_to_host_bytes;
  EXPECT_GT(read, 0u) << "chunks came from the disk tier";
}

// Two tensor-parallel ranks: each holds half of the query heads and of
// their key/value heads, of the gate and up columns, of the vocabulary.
TEST_P(LlamaReferenceTest, TwoTensorRanksTrainAsThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  if (ref.model.KvHeads() % 2 != 0) {
    ModelConfig model = ref.model;
    const absl::Status refused = CheckModelConfig(model, 2);
    EXPECT_NE(refused.message().find("model.kv_heads"), std::string::npos) << refused;
    GTEST_SKIP() << "one key/value head does not split across two ranks: " << refused;
  }
  ExpectReference(ref, Train(ref, Options(TrainOptions::Precision::kFp32), Streamed(), /*tensor=*/2), 1e-5, 1e-4,
                  1e-4);
}

// Two data ranks, each keeping half of every chunk (parallel.shard: full),
// one row of the batch each.
TEST_P(LlamaReferenceTest, TwoFullyShardedDataRanksTrainAsThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  MemoryOptions memory = Streamed();
  memory.shard = MemoryOptions::Shard::kFull;
  ExpectReference(ref, Train(ref, Options(TrainOptions::Precision::kFp32), memory, 1, /*data=*/2), 1e-5, 1e-4,
                  1e-4);
}

// Every block's activations recomputed in the backward, and the batch in
// two micro-batches of one row (train.grad_accum_steps).
TEST_P(LlamaReferenceTest, RecomputeAndAccumulationTrainAsThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  TrainOptions options = Options(TrainOptions::Precision::kFp32);
  options.grad_accum_steps = 2;
  MemoryOptions memory = Streamed();
  memory.recompute = MemoryOptions::Recompute::kAll;
  ExpectReference(ref, Train(ref, options, memory), 1e-5, 1e-4, 1e-4);
}

// The comparison sees a weight read into the wrong place: the same folder
// with one layer's gate and up projections exchanged (shapes still fit)
// starts elsewhere.
TEST_P(LlamaReferenceTest, AWeightInTheWrongPlaceIsSeen) {
  const Reference& ref = ReferenceOf(GetParam());
  const Trained run =
      Train(ref, Options(TrainOptions::Precision::kFp32), Streamed(), 1, 1, uint64_t{1} << 20, ref.dir + "/swapped");
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_FALSE(run.reports.empty());
  EXPECT_GT(std::abs(run.reports[0].loss - ref.losses[0]), 1e-3) << "loss " << run.reports[0].loss;
}

// bf16 weights, activations and gradients (fp32 masters and moments):
// within bf16's rounding (a relative 4e-3 a value) of the fp64 reference.
TEST_P(LlamaReferenceTest, ChunkedBf16TracksThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  ExpectReference(ref, Train(ref, Options(TrainOptions::Precision::kBf16), Streamed()), 2e-2, 2e-2, 3e-2);
}

// fp16 weights, activations and gradients with dynamic loss scaling: within
// fp16's rounding (a relative 5e-4 a value) of the fp64 reference.
TEST_P(LlamaReferenceTest, ChunkedFp16TracksThePyTorchReference) {
  const Reference& ref = ReferenceOf(GetParam());
  TrainOptions options = Options(TrainOptions::Precision::kFp16);
  options.loss_scale = 1024;
  ExpectReference(ref, Train(ref, options, Streamed()), 2e-2, 2e-2, 3e-2);
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaReferenceTest, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ferry
