#include "engine/train/generator.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "engine/checkpoint/safetensors.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt2_weights.h"
#include "engine/train/hf_export.h"
#include "engine/train/inference_model.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

constexpr int64_t kVocab = 32;
constexpr int64_t kBranching = 2;
constexpr uint64_t kChainSeed = 7;
constexpr uint64_t kAmple = 1ull << 30;

ModelConfig Model() {
  ModelConfig c;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.vocab_size = kVocab;
  c.seq_len = 32;
  return c;
}

TrainOptions Training() {
  TrainOptions o;
  o.steps = 300;
  o.batch_size = 16;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.warmup_steps = 10;
  o.threads = 1;
  return o;
}

class QuietObserver : public TrainingObserver {
 public:
  void OnStep(const StepReport& r) override { last_loss = r.loss; }
  double last_loss = 0;
};

// One model trained on the chain, shared by the tests: its last
// checkpoint, and the same weights as a GPT-2 safetensors file.
class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    checkpoint_ = new CheckpointContents();
    SimulatedDevice device(kAmple);
    EngineOptions engine;
    engine.device = &device;
    engine.checkpoint_every_steps = Training().steps;
    engine.on_checkpoint = [](CheckpointContents c, double) {
      *checkpoint_ = std::move(c);
      return absl::OkStatus();
    };
    QuietObserver observer;
    const absl::Status trained =
        Trainer(Model(), Training(), engine,
                std::make_unique<SyntheticSource>(kVocab, kBranching, kChainSeed, 1), &observer)
            .Run();
    ASSERT_TRUE(trained.ok()) << trained;
    final_loss_ = observer.last_loss;
    absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
        ExportHfWeights(Model(), Training(), MemoryOptions(), {checkpoint_}, &device);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    std::string bytes;
    ASSERT_TRUE(SerializeSafetensors(*tensors, Gpt2ConfigMetadata(Model()), &bytes).ok());
    weights_ = new std::string(::testing::TempDir() + "/generator_test.safetensors");
    std::ofstream(*weights_, std::ios::binary) << bytes;
  }
  static void TearDownTestSuite() {
    delete checkpoint_;
    delete weights_;
  }

  static std::vector<int64_t> Run(InferenceModel& model, const std::vector<int64_t>& prompt,
                                  const SamplingOptions& options) {
    std::vector<int64_t> out;
    absl::StatusOr<GenerationStats> stats = Generate(model, prompt, options, [&](int64_t t) {
      out.push_back(t);
      return true;
    });
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (stats.ok()) {
      EXPECT_EQ(stats->generated_tokens, static_cast<int64_t>(out.size()));
      EXPECT_EQ(stats->prompt_tokens, static_cast<int64_t>(prompt.size()));
    }
    return out;
  }

  static CheckpointContents* checkpoint_;
  static std::string* weights_;
  static double final_loss_;
};

CheckpointContents* GeneratorTest::checkpoint_ = nullptr;
std::string* GeneratorTest::weights_ = nullptr;
double GeneratorTest::final_loss_ = 0;

SamplingOptions Greedy(int64_t tokens) {
  SamplingOptions o;
  o.max_tokens = tokens;
  o.temperature = 0;
  return o;
}

TEST_F(GeneratorTest, GreedyIsDeterministic) {
  SimulatedDevice device(kAmple);
  auto model = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> a = Run(**model, {3, 5}, Greedy(40));
  ASSERT_EQ(a.size(), 40u);
  EXPECT_EQ(Run(**model, {3, 5}, Greedy(40)), a);
  SamplingOptions other_seed = Greedy(40);
  other_seed.seed = 99;
  EXPECT_EQ(Run(**model, {3, 5}, other_seed), a) << "greedy draws nothing";
}

TEST_F(GeneratorTest, SamplingWithASeedIsReproducible) {
  SimulatedDevice device(kAmple);
  auto model = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  SamplingOptions o;
  o.max_tokens = 48;
  o.temperature = 1.5;  // flat enough that seeds differ
  o.seed = 11;
  const std::vector<int64_t> a = Run(**model, {1}, o);
  EXPECT_EQ(Run(**model, {1}, o), a);
  o.seed = 12;
  EXPECT_NE(Run(**model, {1}, o), a);
}

TEST_F(GeneratorTest, TopKOfOneIsGreedy) {
  SimulatedDevice device(kAmple);
  auto model = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  SamplingOptions o;
  o.max_tokens = 30;
  o.temperature = 1.3;
  o.top_k = 1;
  o.seed = 5;
  EXPECT_EQ(Run(**model, {4}, o), Run(**model, {4}, Greedy(30)));
  // A top_p small enough keeps the most likely token alone as well.
  o.top_k = 0;
  o.top_p = 1e-6;
  EXPECT_EQ(Run(**model, {4}, o), Run(**model, {4}, Greedy(30)));
}

TEST_F(GeneratorTest, ChunksOnATightDeviceGiveTheWholeModelsTokens) {
  // Beyond the window: the context slides.
  const std::vector<int64_t> prompt = {2, 9, 4};
  const at::Tensor tokens = at::arange(20, at::kLong).remainder(kVocab).reshape({1, 20});
  std::vector<int64_t> expected;
  at::Tensor expected_logits;
  {
    SimulatedDevice ample(kAmple);
    auto whole = LoadInferenceModel(*weights_, Model(), Training(), std::nullopt, &ample);
    ASSERT_TRUE(whole.ok()) << whole.status();
    expected = Run(**whole, prompt, Greedy(50));
    absl::StatusOr<at::Tensor> logits = (*whole)->LastLogits(tokens);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->sizes(), (std::vector<int64_t>{1, kVocab}));
    expected_logits = *logits;
  }
  const uint64_t model_bytes = static_cast<uint64_t>(Model().ParameterCount()) * 4;
  {
    SimulatedDevice tight(model_bytes * 4 / 5);
    auto from_file = LoadInferenceModel(*weights_, Model(), Training(), MemoryOptions(), &tight);
    ASSERT_TRUE(from_file.ok()) << from_file.status();
    tight.ResetPeak();
    EXPECT_EQ(Run(**from_file, prompt, Greedy(50)), expected);
    EXPECT_LT(tight.peak_allocated_bytes(), model_bytes) << "the model never was whole on the device";
  }
  {
    SimulatedDevice tight(model_bytes * 4 / 5);
    auto restored = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &tight);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ(Run(**restored, prompt, Greedy(50)), expected);
    absl::StatusOr<at::Tensor> logits = (*restored)->LastLogits(tokens);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(at::allclose(*logits, expected_logits, 1e-4, 1e-5));
  }
}

TEST_F(GeneratorTest, ContinuationsFollowTheChainsTransitions) {
  SyntheticSource chain(kVocab, kBranching, kChainSeed, 1);
  SimulatedDevice device(kAmple);
  auto model = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  int64_t pairs = 0, followed = 0;
  for (int64_t start = 0; start < 8; ++start) {
    SamplingOptions o;
    o.max_tokens = 40;
    o.temperature = 1.0;
    o.seed = static_cast<uint64_t>(start);
    const std::vector<int64_t> out = Run(**model, {start}, o);
    int64_t prev = start;
    for (int64_t next : out) {
      const int64_t* succ = chain.successors(prev);
      ++pairs;
      if (std::find(succ, succ + kBranching, next) != succ + kBranching) ++followed;
      prev = next;
    }
  }
  ASSERT_EQ(pairs, 8 * 40);
  EXPECT_GE(double(followed), 0.95 * double(pairs))
      << followed << " of " << pairs << " pairs follow the chain (final training loss " << final_loss_ << ")";
}

TEST_F(GeneratorTest, StopsWhenTheCallbackSaysSo) {
  SimulatedDevice device(kAmple);
  auto model = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  int calls = 0;
  absl::StatusOr<GenerationStats> stats = Generate(**model, {1}, Greedy(10), [&](int64_t) { return ++calls < 3; });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(stats->generated_tokens, 3);
  EXPECT_TRUE(stats->stopped);
}

TEST_F(GeneratorTest, BadRequestsNameTheField) {
  SimulatedDevice device(kAmple);
  auto model = RestoreInferenceModel(Model(), Training(), MemoryOptions(), *checkpoint_, &device);
  ASSERT_TRUE(model.ok()) << model.status();
  auto refused = [&](const std::vector<int64_t>& prompt, const SamplingOptions& o) {
    return Generate(**model, prompt, o, [](int64_t) { return true; }).status();
  };
  SamplingOptions o;
  o.temperature = -1;
  EXPECT_EQ(refused({1}, o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused({1}, o).message().find("temperature"), std::string::npos);
  o = SamplingOptions();
  o.top_p = 0;
  EXPECT_NE(refused({1}, o).message().find("top_p"), std::string::npos);
  o.top_p = 1.5;
  EXPECT_NE(refused({1}, o).message().find("top_p"), std::string::npos);
  o = SamplingOptions();
  o.max_tokens = 0;
  EXPECT_NE(refused({1}, o).message().find("max_tokens"), std::string::npos);
  o = SamplingOptions();
  o.top_k = -2;
  EXPECT_NE(refused({1}, o).message().find("top_k"), std::string::npos);
  EXPECT_NE(refused({}, SamplingOptions()).message().find("prompt"), std::string::npos);
  const absl::Status outside = refused({1, kVocab}, SamplingOptions());
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("token 1 is 32"), std::string::npos) << outside;
}

TEST_F(GeneratorTest, ACheckpointOfAnotherModelIsRefused) {
  SimulatedDevice device(kAmple);
  ModelConfig other = Model();
  other.hidden = 32;
  auto model = RestoreInferenceModel(other, Training(), MemoryOptions(), *checkpoint_, &device);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
}

TEST(SampleTokenTest, TopKAndTopPKeepOnlyTheMostLikely) {
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 2.9f};
  std::mt19937_64 rng(1);
  SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(SampleToken(logits, o, &rng), 1);
  o.temperature = 1;
  o.top_k = 3;
  for (int i = 0; i < 200; ++i) {
    const int64_t t = SampleToken(logits, o, &rng);
    EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
  }
  o.top_k = 0;
  // 1, then 2 and 4 (equal, by id): the first two already pass 0.5.
  o.top_p = 0.5;
  for (int i = 0; i < 200; ++i) {
    const int64_t t = SampleToken(logits, o, &rng);
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
}

}  // namespace
}  // namespace ferry
