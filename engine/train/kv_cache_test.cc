// Generation with the key/value cache computes what generation without it
// does: for each family (GPT-2's learned positions, Llama's rotary ones and
// grouped queries, Qwen2's biases, Qwen3's q/k norms), through the chunks
// and with the whole model on the device, the same greedy tokens and, one
// position at a time, the same logits as a whole forward over the window;
// with the vocabulary in pieces (VocabPieces) too.

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/train/generator.h"
#include "engine/train/hf_export.h"
#include "engine/train/inference_model.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

constexpr uint64_t kAmple = 1ull << 30;

TrainOptions Training() {
  TrainOptions o;
  o.steps = 20;  // a little structure in the weights; nothing to learn
  o.batch_size = 4;
  o.lr = 3e-3;
  o.warmup_steps = 2;
  o.threads = 1;
  return o;
}

class Quiet : public TrainingObserver {
 public:
  void OnStep(const StepReport&) override {}
};

// A small model of `preset` with 32 positions, trained a few steps: its
// checkpoint and its weights as a Hugging Face file. "PRESET/pieces": with
// its vocabulary in pieces of 64 rows.
struct Trained {
  ModelConfig config;
  CheckpointContents checkpoint;
  std::string weights;
};

Trained Train(const std::string& param) {
  const std::string preset = param.substr(0, param.find('/'));
  Trained t;
  t.config = *ModelPreset(preset);
  t.config.seq_len = 32;
  if (preset != param) t.config.vocab_piece_rows = 64;
  SimulatedDevice device(kAmple);
  EngineOptions engine;
  engine.device = &device;
  engine.memory = MemoryOptions();
  engine.checkpoint_every_steps = Training().steps;
  engine.on_checkpoint = [&](CheckpointContents c, double) {
    t.checkpoint = std::move(c);
    return absl::OkStatus();
  };
  Quiet quiet;
  const absl::Status trained =
      Trainer(t.config, Training(), engine, std::make_unique<SyntheticSource>(t.config.vocab_size, 4, 7, 1), &quiet)
          .Run();
  EXPECT_TRUE(trained.ok()) << trained;
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ExportHfWeights(t.config, Training(), MemoryOptions(), {&t.checkpoint}, &device);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  std::string bytes;
  if (tensors.ok()) {
    EXPECT_TRUE(SerializeSafetensors(*tensors, {{"format", "pt"}}, &bytes).ok());
  }
  t.weights = ::testing::TempDir() + "/kv_cache_" + preset + (preset != param ? "_pieces" : "") + ".safetensors";
  std::ofstream(t.weights, std::ios::binary) << bytes;
  return t;
}

std::vector<int64_t> Generated(InferenceModel& model, const std::vector<int64_t>& prompt, SamplingOptions options) {
  std::vector<int64_t> out;
  absl::StatusOr<GenerationStats> stats = Generate(model, prompt, options, [&](int64_t t) {
    out.push_back(t);
    return true;
  });
  EXPECT_TRUE(stats.ok()) << stats.status();
  return out;
}

SamplingOptions Greedy(int64_t tokens, bool cache) {
  SamplingOptions o;
  o.max_tokens = tokens;
  o.temperature = 0;
  o.use_cache = cache;
  return o;
}

class KvCacheTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KvCacheTest, CachedGenerationIsGenerationWithoutTheCache) {
  const Trained t = Train(GetParam());
  SimulatedDevice device(kAmple);
  absl::StatusOr<std::unique_ptr<InferenceModel>> chunked =
      RestoreInferenceModel(t.config, Training(), MemoryOptions(), t.checkpoint, &device);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  absl::StatusOr<std::unique_ptr<InferenceModel>> whole =
      LoadInferenceModel(t.weights, t.config, Training(), std::nullopt, &device);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::vector<int64_t> prompt = {1, 2, 3, 1, 0};
  for (InferenceModel* model : {chunked->get(), whole->get()}) {
    SCOPED_TRACE(model == chunked->get() ? "chunked" : "whole");
    // Within the window: token for token.
    const std::vector<int64_t> plain = Generated(*model, prompt, Greedy(27, false));
    const std::vector<int64_t> cached = Generated(*model, prompt, Greedy(27, true));
    EXPECT_EQ(cached, plain);
    ASSERT_EQ(cached.size(), 27u);
    // Position by position, the cached forward's logits are the whole
    // window's.
    model->ResetCache();
    std::vector<int64_t> context = prompt;
    context.insert(context.end(), plain.begin(), plain.end());
    for (size_t n = 0; n < context.size(); ++n) {
      at::Tensor one = at::full({1, 1}, context[n], at::kLong);
      absl::StatusOr<at::Tensor> step = model->AppendLogits(one);
      ASSERT_TRUE(step.ok()) << step.status();
      at::Tensor window = at::tensor(std::vector<int64_t>(context.begin(), context.begin() + n + 1)).unsqueeze(0);
      absl::StatusOr<at::Tensor> full = model->LastLogits(window);
      ASSERT_TRUE(full.ok()) << full.status();
      EXPECT_LT((*step - *full).abs().max().item<double>(), 1e-4) << "position " << n;
    }
    EXPECT_EQ(model->cached_positions(), t.config.seq_len);
    // A full cache takes no more positions; generation goes on past the
    // window by starting the cache again.
    const absl::StatusOr<at::Tensor> beyond = model->AppendLogits(at::zeros({1, 1}, at::kLong));
    EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Generated(*model, prompt, Greedy(70, true)).size(), 70u);
  }
}

TEST_P(KvCacheTest, AStopTokenEndsGeneration) {
  const Trained t = Train(GetParam());
  SimulatedDevice device(kAmple);
  absl::StatusOr<std::unique_ptr<InferenceModel>> model =
      LoadInferenceModel(t.weights, t.config, Training(), std::nullopt, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> prompt = {1, 2, 3};
  const std::vector<int64_t> free = Generated(**model, prompt, Greedy(20, true));
  ASSERT_EQ(free.size(), 20u);
  SamplingOptions stopping = Greedy(20, true);
  stopping.stop_tokens = {free[5]};
  std::vector<int64_t> out;
  absl::StatusOr<GenerationStats> stats = Generate(**model, prompt, stopping, [&](int64_t token) {
    out.push_back(token);
    return true;
  });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->stop_token);
  const size_t first = static_cast<size_t>(std::find(free.begin(), free.end(), free[5]) - free.begin());
  EXPECT_EQ(out, std::vector<int64_t>(free.begin(), free.begin() + first + 1)) << "up to and with the stop token";
}

INSTANTIATE_TEST_SUITE_P(Families, KvCacheTest,
                         ::testing::Values("gpt2-tiny", "llama-tiny", "qwen2-tiny", "qwen3-tiny", "gpt2-tiny/pieces",
                                           "llama-tiny/pieces"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-' || c == '/') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace ferry
