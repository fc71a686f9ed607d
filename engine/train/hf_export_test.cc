// The GPT-2 export: names, shapes and order as Hugging Face's GPT-2 has
// them, values the model's parameters (transposed where GPT-2 keeps Conv1D
// weights), from checkpoints of one rank and of tensor-parallel ranks.

#include "engine/train/hf_export.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/cpu_generator.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/model/gpt2_weights.h"
#include "engine/parallel/communicator.h"
#include "engine/train/inference_model.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

class Quiet : public TrainingObserver {
 public:
  void OnStep(const StepReport&) override {}
};

ModelConfig Model() {
  ModelConfig c;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.vocab_size = 64;
  c.seq_len = 16;
  c.dropout = 0.1;
  return c;
}

TrainOptions Options(double lr) {
  TrainOptions o;
  o.steps = 3;
  o.batch_size = 4;
  o.lr = lr;
  o.min_lr = lr / 10;
  o.warmup_steps = 1;
  o.threads = 1;
  o.seed = 7;
  return o;
}

MemoryOptions Memory() {
  MemoryOptions m;
  m.chunk_elements = 4096;  // several chunks
  return m;
}

std::unique_ptr<TokenSource> Data() { return std::make_unique<SyntheticSource>(64, 2, 1, 5); }

at::Tensor Values(const SafetensorsTensor& t) {
  EXPECT_EQ(t.dtype, "F32");
  at::Tensor v = at::empty(t.shape, at::kFloat);
  EXPECT_EQ(static_cast<size_t>(v.nbytes()), t.data.size());
  std::memcpy(v.data_ptr(), t.data.data(), t.data.size());
  return v;
}

// Trains one rank and returns its last checkpoint (written after the last
// step).
CheckpointContents TrainOneRank(SimulatedDevice* device, const TrainOptions& options, const MemoryOptions& memory,
                                const std::string& init_from = "") {
  CheckpointContents last;
  EngineOptions engine;
  engine.device = device;
  engine.memory = memory;
  engine.init_from = init_from;
  engine.checkpoint_every_steps = options.steps;
  engine.on_checkpoint = [&](const CheckpointContents& c, auto... /*snapshot timing*/) -> absl::Status {
    last = c;
    return absl::OkStatus();
  };
  Quiet quiet;
  EXPECT_TRUE(Trainer(Model(), options, engine, Data(), &quiet).Run().ok());
  EXPECT_EQ(last.step, options.steps);
  return last;
}

// Trains a world of tensor x data ranks as threads; every rank's last
// checkpoint, by world rank.
std::vector<CheckpointContents> TrainParallel(SimulatedDevice* device, int tensor, int data,
                                              const TrainOptions& options, const MemoryOptions& memory,
                                              const std::string& init_from = "") {
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  std::vector<CheckpointContents> last(static_cast<size_t>(tensor * data));
  std::vector<std::thread> threads;
  for (int r = 0; r < tensor * data; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions comm;
      comm.timeout = std::chrono::seconds(60);
      absl::StatusOr<ParallelGroups> groups = JoinParallelGroups(store, r, tensor, data, comm);
      ASSERT_TRUE(groups.ok()) << groups.status();
      EngineOptions engine;
      engine.device = device;
      engine.memory = memory;
      engine.tensor = groups->tensor.get();
      engine.data = groups->data.get();
      engine.init_from = init_from;
      engine.checkpoint_every_steps = options.steps;
      engine.on_checkpoint = [&, r](const CheckpointContents& c, auto...) -> absl::Status {
        last[static_cast<size_t>(r)] = c;
        return absl::OkStatus();
      };
      Quiet quiet;
      const absl::Status trained = Trainer(Model(), options, engine, Data(), &quiet).Run();
      EXPECT_TRUE(trained.ok()) << trained;
      EXPECT_TRUE(FinishParallelGroups(*groups).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  return last;
}

void ExpectGpt2Layout(const std::vector<SafetensorsTensor>& tensors) {
  const std::vector<Gpt2Tensor> layout = Gpt2Tensors(Model());
  ASSERT_EQ(tensors.size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(tensors[i].name, layout[i].name) << i;
    EXPECT_EQ(tensors[i].shape, layout[i].shape) << layout[i].name;
  }
}

// With a learning rate of 0 training leaves the initial values, which a
// model built with the same seed has: the export must hold exactly those,
// laid out as GPT-2's.
void ExpectInitialModel(const std::vector<SafetensorsTensor>& tensors, uint64_t seed) {
  CpuGeneratorScope generator(at::make_generator<at::CPUGeneratorImpl>(seed));
  Gpt model(Model());
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model->named_parameters()) params[item.key()] = item.value().detach();
  ASSERT_EQ(params.size(), tensors.size());
  for (const SafetensorsTensor& t : tensors) {
    ASSERT_TRUE(params.count(t.name)) << t.name;
    at::Tensor expected = params[t.name];
    const bool conv1d = t.name.find(".c_attn.weight") != std::string::npos ||
                        t.name.find(".c_proj.weight") != std::string::npos ||
                        t.name.find(".c_fc.weight") != std::string::npos;
    if (conv1d) expected = expected.t();
    EXPECT_TRUE(at::equal(Values(t), expected.contiguous())) << t.name;
  }
}

TEST(Gpt2ExportTest, NamesShapesAndValuesAreGpt2s) {
  SimulatedDevice device(uint64_t{1} << 30);
  for (auto precision : {TrainOptions::Precision::kFp32, TrainOptions::Precision::kBf16}) {
    SCOPED_TRACE(precision == TrainOptions::Precision::kFp32 ? "fp32" : "bf16");
    TrainOptions options = Options(0.0);
    options.precision = precision;
    const CheckpointContents checkpoint = TrainOneRank(&device, options, Memory());
    // Another seed: the values must come from the checkpoint, not from
    // building the model again.
    TrainOptions reader = options;
    reader.seed = 99;
    absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
        ExportHfWeights(Model(), reader, Memory(), {&checkpoint}, &device);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ExpectGpt2Layout(*tensors);
    ExpectInitialModel(*tensors, options.seed);
    // And they serialize.
    std::string bytes;
    EXPECT_TRUE(SerializeSafetensors(*tensors, Gpt2ConfigMetadata(Model()), &bytes).ok());
  }
}

// GPT-2's q, k, v columns: the first hidden columns of c_attn computed from
// x are the query the model's attention uses.
TEST(Gpt2ExportTest, FusedQkvIsGpt2sOrder) {
  SimulatedDevice device(uint64_t{1} << 30);
  const CheckpointContents checkpoint = TrainOneRank(&device, Options(0.0), Memory());
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ExportHfWeights(Model(), Options(0.0), Memory(), {&checkpoint}, &device);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  CpuGeneratorScope generator(at::make_generator<at::CPUGeneratorImpl>(Options(0.0).seed));
  Gpt model(Model());
  const at::Tensor x = at::randn({5, Model().hidden});
  at::Tensor w, b;
  for (const SafetensorsTensor& t : *tensors) {
    if (t.name == "h.0.attn.c_attn.weight") w = Values(t);
    if (t.name == "h.0.attn.c_attn.bias") b = Values(t);
  }
  ASSERT_TRUE(w.defined() && b.defined());
  // Conv1D: x @ W + b.
  const at::Tensor ours = model->block(0).attn->c_attn->forward(x).detach();
  EXPECT_TRUE(at::allclose(at::addmm(b, x, w), ours, 1e-5, 1e-6));
}

// Tensor ranks' shards join into the one-rank model's tensors.
TEST(Gpt2ExportTest, TensorParallelShardsJoin) {
  SimulatedDevice device(uint64_t{4} << 30);
  const std::vector<CheckpointContents> ranks = TrainParallel(&device, 2, 1, Options(0.0), Memory());
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ExportHfWeights(Model(), Options(0.0), Memory(), {&ranks[0], &ranks[1]}, &device);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ExpectGpt2Layout(*tensors);
  ExpectInitialModel(*tensors, Options(0.0).seed);

  // Trained for real, two tensor ranks and one end up with the same weights
  // (training is the same for every T, up to rounding, which AdamW may
  // magnify where a gradient is near zero; a misjoined shard would be off
  // by the weights' own size, about 0.02).
  const std::vector<CheckpointContents> trained = TrainParallel(&device, 2, 1, Options(3e-3), Memory());
  const CheckpointContents one = TrainOneRank(&device, Options(3e-3), Memory());
  absl::StatusOr<std::vector<SafetensorsTensor>> parallel =
      ExportHfWeights(Model(), Options(3e-3), Memory(), {&trained[0], &trained[1]}, &device);
  absl::StatusOr<std::vector<SafetensorsTensor>> single =
      ExportHfWeights(Model(), Options(3e-3), Memory(), {&one}, &device);
  ASSERT_TRUE(parallel.ok() && single.ok());
  ASSERT_EQ(parallel->size(), single->size());
  bool moved = false;
  CpuGeneratorScope generator(at::make_generator<at::CPUGeneratorImpl>(Options(0.0).seed));
  Gpt initial(Model());
  for (size_t i = 0; i < single->size(); ++i) {
    const at::Tensor a = Values((*parallel)[i]), b = Values((*single)[i]);
    EXPECT_TRUE(at::allclose(a, b, 0, 1e-3)) << (*single)[i].name << " differs by "
                                                << (a - b).abs().max().item<float>();
    if ((*single)[i].name == "h.0.mlp.c_fc.weight") {
      moved = !at::allclose(b, initial->block(0).mlp->c_fc->weight.detach().t(), 1e-6, 1e-6);
    }
  }
  EXPECT_TRUE(moved) << "training changed the weights";
}

// Sharded across two data ranks (memory.shard), each rank's checkpoint
// holds its half of the mixed-precision masters: the export joins them.
// With a learning rate of 0 that is the initial model exactly; trained, it
// is the unsharded run's weights (to rounding, as above). One rank's
// checkpoint alone is refused, and generation reads one rank's whole
// weights.
TEST(Gpt2ExportTest, DataRanksShardsJoin) {
  SimulatedDevice device(uint64_t{4} << 30);
  for (auto [level, precision] : {std::pair{MemoryOptions::Shard::kOptimizer, TrainOptions::Precision::kFp32},
                                  std::pair{MemoryOptions::Shard::kOptimizer, TrainOptions::Precision::kBf16},
                                  std::pair{MemoryOptions::Shard::kFull, TrainOptions::Precision::kFp32},
                                  std::pair{MemoryOptions::Shard::kFull, TrainOptions::Precision::kBf16}}) {
    MemoryOptions sharded = Memory();
    sharded.shard = level;
    const bool full = level == MemoryOptions::Shard::kFull;
    SCOPED_TRACE(::testing::Message() << (full ? "full " : "optimizer ")
                                      << (precision == TrainOptions::Precision::kFp32 ? "fp32" : "bf16"));
    TrainOptions still = Options(0.0);
    still.precision = precision;
    const std::vector<CheckpointContents> initial = TrainParallel(&device, 1, 2, still, sharded);
    absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
        ExportHfWeights(Model(), still, sharded, {&initial[0], &initial[1]}, &device, 2);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ExpectGpt2Layout(*tensors);
    ExpectInitialModel(*tensors, still.seed);
    absl::StatusOr<std::vector<SafetensorsTensor>> alone =
        ExportHfWeights(Model(), still, sharded, {&initial[0]}, &device);
    EXPECT_EQ(alone.status().code(), absl::StatusCode::kInvalidArgument) << alone.status();

    TrainOptions trained = Options(3e-3);
    trained.precision = precision;
    const std::vector<CheckpointContents> shards = TrainParallel(&device, 1, 2, trained, sharded);
    const std::vector<CheckpointContents> whole = TrainParallel(&device, 1, 2, trained, Memory());
    absl::StatusOr<std::vector<SafetensorsTensor>> joined =
        ExportHfWeights(Model(), trained, sharded, {&shards[0], &shards[1]}, &device, 2);
    absl::StatusOr<std::vector<SafetensorsTensor>> replicated =
        ExportHfWeights(Model(), trained, Memory(), {&whole[0]}, &device);
    ASSERT_TRUE(joined.ok()) << joined.status();
    ASSERT_TRUE(replicated.ok()) << replicated.status();
    ASSERT_EQ(joined->size(), replicated->size());
    for (size_t i = 0; i < joined->size(); ++i) {
      const at::Tensor a = Values((*joined)[i]), b = Values((*replicated)[i]);
      EXPECT_TRUE(at::allclose(a, b, 0, 1e-3)) << (*joined)[i].name << " differs by "
                                                  << (a - b).abs().max().item<float>();
    }

    // Generation: data rank 0's chunks, laid out for its shard, hold the
    // whole weights; the logits are the unsharded run's initial model's.
    // Fully sharded they hold half: refused, saying what to do instead.
    absl::StatusOr<std::unique_ptr<InferenceModel>> from_shard =
        RestoreInferenceModel(Model(), still, sharded, initial[0], &device, 2);
    if (full) {
      EXPECT_EQ(from_shard.status().code(), absl::StatusCode::kFailedPrecondition) << from_shard.status();
      EXPECT_NE(from_shard.status().message().find("export"), std::string::npos) << from_shard.status();
      continue;
    }
    const CheckpointContents one = TrainOneRank(&device, still, Memory());
    absl::StatusOr<std::unique_ptr<InferenceModel>> from_one =
        RestoreInferenceModel(Model(), still, Memory(), one, &device);
    ASSERT_TRUE(from_shard.ok()) << from_shard.status();
    ASSERT_TRUE(from_one.ok()) << from_one.status();
    const at::Tensor tokens = at::arange(8, at::kLong).reshape({1, 8});
    absl::StatusOr<at::Tensor> a = (*from_shard)->LastLogits(tokens);
    absl::StatusOr<at::Tensor> b = (*from_one)->LastLogits(tokens);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(at::equal(*a, *b));
  }
}

TEST(Gpt2ExportTest, AnotherModelIsRefused) {
  SimulatedDevice device(uint64_t{1} << 30);
  const CheckpointContents checkpoint = TrainOneRank(&device, Options(0.0), Memory());
  ModelConfig other = Model();
  other.layers = 3;
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ExportHfWeights(other, Options(0.0), Memory(), {&checkpoint}, &device);
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument) << tensors.status();
}

// --- Pretrained weights in (model.init_from). ---

std::string TestFile(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

std::string WriteFile(const std::string& name, const std::vector<SafetensorsTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string bytes;
  EXPECT_TRUE(SerializeSafetensors(tensors, metadata, &bytes).ok());
  const std::string path = TestFile(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Export, then start another job from the file: with a learning rate of 0
// the weights stay what they were read as, and its export is the same file
// bit for bit -- in fp32 and bf16 (the fp32 masters are the file's values),
// and with two tensor-parallel ranks each reading its part.
TEST(Gpt2ImportTest, ExportThenInitFromIsBitwise) {
  SimulatedDevice device(uint64_t{1} << 30);
  for (auto precision : {TrainOptions::Precision::kFp32, TrainOptions::Precision::kBf16}) {
    SCOPED_TRACE(precision == TrainOptions::Precision::kFp32 ? "fp32" : "bf16");
    TrainOptions trained = Options(3e-3);
    trained.precision = precision;
    const CheckpointContents checkpoint = TrainOneRank(&device, trained, Memory());
    absl::StatusOr<std::vector<SafetensorsTensor>> exported =
        ExportHfWeights(Model(), trained, Memory(), {&checkpoint}, &device);
    ASSERT_TRUE(exported.ok()) << exported.status();
    const std::string path = WriteFile("exported.safetensors", *exported, Gpt2ConfigMetadata(Model()));

    TrainOptions still = Options(0.0);
    still.precision = precision;
    still.seed = 99;  // the values come from the file, not from the seed
    const CheckpointContents again = TrainOneRank(&device, still, Memory(), path);
    absl::StatusOr<std::vector<SafetensorsTensor>> round = ExportHfWeights(Model(), still, Memory(), {&again}, &device);
    ASSERT_TRUE(round.ok()) << round.status();
    ASSERT_EQ(round->size(), exported->size());
    for (size_t i = 0; i < round->size(); ++i) {
      EXPECT_EQ((*round)[i].data, (*exported)[i].data) << (*round)[i].name;
    }

    const std::vector<CheckpointContents> ranks = TrainParallel(&device, 2, 1, still, Memory(), path);
    absl::StatusOr<std::vector<SafetensorsTensor>> joined =
        ExportHfWeights(Model(), still, Memory(), {&ranks[0], &ranks[1]}, &device);
    ASSERT_TRUE(joined.ok()) << joined.status();
    for (size_t i = 0; i < joined->size(); ++i) {
      EXPECT_EQ((*joined)[i].data, (*exported)[i].data) << (*joined)[i].name << " (two tensor ranks)";
    }
  }
}

// Starting from the file trains as the run that wrote it would have gone
// on: the first loss is the one the exported weights give, not a fresh
// model's.
TEST(Gpt2ImportTest, TrainingStartsFromTheFilesWeights) {
  SimulatedDevice device(uint64_t{1} << 30);
  const CheckpointContents checkpoint = TrainOneRank(&device, Options(3e-3), Memory());
  absl::StatusOr<std::vector<SafetensorsTensor>> exported =
      ExportHfWeights(Model(), Options(3e-3), Memory(), {&checkpoint}, &device);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const std::string path = WriteFile("start.safetensors", *exported, {});
  class Losses : public TrainingObserver {
   public:
    void OnStep(const StepReport& r) override { losses.push_back(r.loss); }
    std::vector<double> losses;
  };
  auto first_loss = [&](const std::string& init_from, bool chunked) {
    EngineOptions engine;
    engine.device = &device;
    if (chunked) {
      engine.memory = Memory();
    } else {
      engine.memory.reset();  // the plain loop: a model built whole
    }
    engine.init_from = init_from;
    TrainOptions o = Options(3e-3);
    o.steps = 1;
    Losses observer;
    EXPECT_TRUE(Trainer(Model(), o, engine, Data(), &observer).Run().ok());
    return observer.losses.empty() ? 0.0 : observer.losses[0];
  };
  const double fresh = first_loss("", true);
  const double chunked = first_loss(path, true);
  const double plain = first_loss(path, false);
  EXPECT_NE(chunked, fresh);
  EXPECT_LT(chunked, fresh) << "the trained weights fit the data better";
  // (The chunked head sums its loss in vocabulary slices: the same to 1e-6.)
  EXPECT_NEAR(chunked, plain, 1e-5) << "the plain loop starts from the same weights";
}

TEST(Gpt2ImportTest, AFileThatIsNotTheModelIsRefusedNamingTheTensor) {
  std::vector<SafetensorsTensor> tensors;
  for (const Gpt2Tensor& t : Gpt2Tensors(Model())) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    tensors.push_back({t.name, "F32", t.shape, std::string(static_cast<size_t>(n) * 4, '\0')});
  }
  auto run = [&](const std::vector<SafetensorsTensor>& file) {
    const std::string path = WriteFile("bad.safetensors", file, {});
    SimulatedDevice device(uint64_t{1} << 30);
    EngineOptions engine;
    engine.device = &device;
    engine.memory = Memory();
    engine.init_from = path;
    Quiet quiet;
    return Trainer(Model(), Options(1e-3), engine, Data(), &quiet).Run();
  };
  std::vector<SafetensorsTensor> missing = tensors;
  missing.erase(missing.begin() + 5);
  absl::Status s = run(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("has no h.0.attn.c_attn.bias ([96] for this model)"), std::string::npos) << s;

  std::vector<SafetensorsTensor> wrong = tensors;
  wrong[4] = {"h.0.attn.c_attn.weight", "F32", {96, 32}, wrong[4].data};
  s = run(wrong);
  EXPECT_NE(s.message().find("h.0.attn.c_attn.weight is [96, 32] in the file but [32, 96] in this model"),
            std::string::npos)
      << s;

  std::vector<SafetensorsTensor> extra = tensors;
  extra.push_back({"h.2.ln_1.weight", "F32", {32}, std::string(128, '\0')});
  s = run(extra);
  EXPECT_NE(s.message().find("holds h.2.ln_1.weight [32], which this model has no place for"), std::string::npos)
      << s;

  std::vector<SafetensorsTensor> ints = tensors;
  ints[0].dtype = "I32";
  s = run(ints);
  EXPECT_NE(s.message().find("wte.weight is I32; weights must be F32, F16 or BF16"), std::string::npos) << s;

  // What GPT-2's own files hold beside the weights is passed over.
  std::vector<SafetensorsTensor> buffers = tensors;
  buffers.push_back({"h.0.attn.bias", "F32", {1, 1, 16, 16}, std::string(1024, '\0')});
  buffers.push_back({"lm_head.weight", "F32", {64, 32}, tensors[0].data});
  EXPECT_TRUE(run(buffers).ok());

  s = run({});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(Gpt2ImportTest, TheConfigIsReadFromTheShapes) {
  std::vector<SafetensorsTensor> tensors;
  for (const Gpt2Tensor& t : Gpt2Tensors(Model())) {
    tensors.push_back({t.name, "BF16", t.shape, std::string()});
  }
  SafetensorsIndex index;
  for (const SafetensorsTensor& t : tensors) index.tensors.push_back({"transformer." + t.name, t.dtype, t.shape});
  absl::StatusOr<ModelConfig> bare = Gpt2ConfigFromWeights(index, "/nowhere/model.safetensors", 0);
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bare.status().message().find("set model.heads"), std::string::npos) << bare.status();
  index.metadata["n_head"] = "4";
  absl::StatusOr<ModelConfig> c = Gpt2ConfigFromWeights(index, "/nowhere/model.safetensors", 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layers, 2);
  EXPECT_EQ(c->hidden, 32);
  EXPECT_EQ(c->heads, 4);
  EXPECT_EQ(c->vocab_size, 64);
  EXPECT_EQ(c->seq_len, 16);
  EXPECT_TRUE(CheckGpt2Weights(index, *c, "m").ok()) << "names under transformer. are found";
  // Heads from a config.json beside the file, or from the caller.
  index.metadata.clear();
  const std::string dir = TestFile("withconfig");
  ::mkdir(dir.c_str(), 0700);
  std::ofstream(dir + "/config.json") << R"({"model_type": "gpt2", "n_head": 8, "n_embd": 32})";
  EXPECT_EQ(Gpt2ConfigFromWeights(index, dir + "/model.safetensors", 0)->heads, 8);
  EXPECT_EQ(Gpt2ConfigFromWeights(index, dir + "/model.safetensors", 2)->heads, 2);
  EXPECT_EQ(Gpt2ConfigFromWeights(index, "m", 5).status().code(), absl::StatusCode::kInvalidArgument)
      << "32 does not split into 5 heads";
}

}  // namespace
}  // namespace ferry
