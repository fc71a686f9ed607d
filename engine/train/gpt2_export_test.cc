// The GPT-2 export: names, shapes and order as Hugging Face's GPT-2 has
// them, values the model's parameters (transposed where GPT-2 keeps Conv1D
// weights), from checkpoints of one rank and of tensor-parallel ranks.

#include "engine/train/gpt2_export.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/cpu_generator.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/parallel/communicator.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

class Quiet : public TrainingObserver {
 public:
  void OnStep(const StepReport&) override {}
};

GptConfig Model() {
  GptConfig c;
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

// GPT-2's names and shapes for `c`, in its order.
std::vector<std::pair<std::string, std::vector<int64_t>>> Gpt2Layout(const GptConfig& c) {
  const int64_t h = c.hidden;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"wte.weight", {c.vocab_size, h}},
                                                                   {"wpe.weight", {c.seq_len, h}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string b = absl::StrCat("h.", i, ".");
    out.insert(out.end(), {{b + "ln_1.weight", {h}},
                           {b + "ln_1.bias", {h}},
                           {b + "attn.c_attn.weight", {h, 3 * h}},
                           {b + "attn.c_attn.bias", {3 * h}},
                           {b + "attn.c_proj.weight", {h, h}},
                           {b + "attn.c_proj.bias", {h}},
                           {b + "ln_2.weight", {h}},
                           {b + "ln_2.bias", {h}},
                           {b + "mlp.c_fc.weight", {h, 4 * h}},
                           {b + "mlp.c_fc.bias", {4 * h}},
                           {b + "mlp.c_proj.weight", {4 * h, h}},
                           {b + "mlp.c_proj.bias", {h}}});
  }
  out.push_back({"ln_f.weight", {h}});
  out.push_back({"ln_f.bias", {h}});
  return out;
}

at::Tensor Values(const SafetensorsTensor& t) {
  EXPECT_EQ(t.dtype, "F32");
  at::Tensor v = at::empty(t.shape, at::kFloat);
  EXPECT_EQ(static_cast<size_t>(v.nbytes()), t.data.size());
  std::memcpy(v.data_ptr(), t.data.data(), t.data.size());
  return v;
}

// Trains one rank and returns its last checkpoint (written after the last
// step).
CheckpointContents TrainOneRank(SimulatedDevice* device, const TrainOptions& options, const MemoryOptions& memory) {
  CheckpointContents last;
  EngineOptions engine;
  engine.device = device;
  engine.memory = memory;
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

// Trains a world of tensor x 1 ranks as threads; every rank's last
// checkpoint, by rank.
std::vector<CheckpointContents> TrainTensorParallel(SimulatedDevice* device, int tensor,
                                                    const TrainOptions& options, const MemoryOptions& memory) {
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  std::vector<CheckpointContents> last(static_cast<size_t>(tensor));
  std::vector<std::thread> threads;
  for (int r = 0; r < tensor; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions comm;
      comm.timeout = std::chrono::seconds(60);
      absl::StatusOr<ParallelGroups> groups = JoinParallelGroups(store, r, tensor, 1, comm);
      ASSERT_TRUE(groups.ok()) << groups.status();
      EngineOptions engine;
      engine.device = device;
      engine.memory = memory;
      engine.tensor = groups->tensor.get();
      engine.data = groups->data.get();
      engine.checkpoint_every_steps = options.steps;
      engine.on_checkpoint = [&, r](const CheckpointContents& c, auto...) -> absl::Status {
        last[static_cast<size_t>(r)] = c;
        return absl::OkStatus();
      };
      Quiet quiet;
      EXPECT_TRUE(Trainer(Model(), options, engine, Data(), &quiet).Run().ok());
      EXPECT_TRUE(FinishParallelGroups(*groups).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  return last;
}

void ExpectGpt2Layout(const std::vector<SafetensorsTensor>& tensors) {
  const auto layout = Gpt2Layout(Model());
  ASSERT_EQ(tensors.size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(tensors[i].name, layout[i].first) << i;
    EXPECT_EQ(tensors[i].shape, layout[i].second) << layout[i].first;
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
        ExportGpt2Weights(Model(), reader, Memory(), {&checkpoint}, &device);
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
      ExportGpt2Weights(Model(), Options(0.0), Memory(), {&checkpoint}, &device);
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
  const std::vector<CheckpointContents> ranks = TrainTensorParallel(&device, 2, Options(0.0), Memory());
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ExportGpt2Weights(Model(), Options(0.0), Memory(), {&ranks[0], &ranks[1]}, &device);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ExpectGpt2Layout(*tensors);
  ExpectInitialModel(*tensors, Options(0.0).seed);

  // Trained for real, two tensor ranks and one end up with the same weights
  // (training is the same for every T, up to rounding, which AdamW may
  // magnify where a gradient is near zero; a misjoined shard would be off
  // by the weights' own size, about 0.02).
  const std::vector<CheckpointContents> trained = TrainTensorParallel(&device, 2, Options(3e-3), Memory());
  const CheckpointContents one = TrainOneRank(&device, Options(3e-3), Memory());
  absl::StatusOr<std::vector<SafetensorsTensor>> parallel =
      ExportGpt2Weights(Model(), Options(3e-3), Memory(), {&trained[0], &trained[1]}, &device);
  absl::StatusOr<std::vector<SafetensorsTensor>> single =
      ExportGpt2Weights(Model(), Options(3e-3), Memory(), {&one}, &device);
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

TEST(Gpt2ExportTest, AnotherModelIsRefused) {
  SimulatedDevice device(uint64_t{1} << 30);
  const CheckpointContents checkpoint = TrainOneRank(&device, Options(0.0), Memory());
  GptConfig other = Model();
  other.layers = 3;
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ExportGpt2Weights(other, Options(0.0), Memory(), {&checkpoint}, &device);
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument) << tensors.status();
}

}  // namespace
}  // namespace ferry
