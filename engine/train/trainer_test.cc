#include "engine/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "engine/data/synthetic_source.h"

namespace ferry {
namespace {

class RecordingObserver : public TrainingObserver {
 public:
  void OnStarted(const TrainingStarted& s) override { started = s; }
  void OnStep(const StepReport& r) override { reports.push_back(r); }
  bool StopRequested() override { return stop_after > 0 && int(reports.size()) >= stop_after; }

  TrainingStarted started;
  std::vector<StepReport> reports;
  int stop_after = 0;
};

GptConfig TinyModel() {
  GptConfig c;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.vocab_size = 64;
  c.seq_len = 32;
  return c;
}

TrainOptions Quick(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 8;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.warmup_steps = 5;
  o.threads = 1;
  return o;
}

std::unique_ptr<TokenSource> Chain(uint64_t seed) {
  return std::make_unique<SyntheticSource>(64, 2, 1, seed);
}

TEST(TrainerTest, LearnsTheSyntheticChain) {
  RecordingObserver observer;
  Trainer trainer(TinyModel(), Quick(120), Chain(1), c10::Device(c10::kCPU), &observer);
  ASSERT_TRUE(trainer.Run().ok());
  ASSERT_EQ(observer.reports.size(), 120u);
  EXPECT_EQ(observer.started.parameters, TinyModel().ParameterCount());
  const double first = observer.reports.front().loss;
  const double last = observer.reports.back().loss;
  EXPECT_NEAR(first, std::log(64.0), 0.3);
  EXPECT_LT(last, 0.5 * std::log(64.0)) << "first " << first;
  const StepReport& r = observer.reports.back();
  EXPECT_EQ(r.step, 120);
  EXPECT_EQ(r.tokens, 120 * 8 * 32);
  EXPECT_GT(r.tokens_per_second, 0);
  EXPECT_GT(r.host_memory_bytes, 0u);
  uint64_t params = 0;
  for (const MemoryUsage& m : r.memory) {
    if (m.kind == "params") params = m.bytes;
  }
  EXPECT_EQ(params, uint64_t(TinyModel().ParameterCount()) * 4);
}

TEST(TrainerTest, SameSeedSameLossesBitForBit) {
  RecordingObserver a, b;
  ASSERT_TRUE(Trainer(TinyModel(), Quick(5), Chain(3), c10::Device(c10::kCPU), &a).Run().ok());
  ASSERT_TRUE(Trainer(TinyModel(), Quick(5), Chain(3), c10::Device(c10::kCPU), &b).Run().ok());
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(a.reports[i].loss, b.reports[i].loss) << i;
}

TEST(TrainerTest, StopsWhenAskedWithCancelled) {
  RecordingObserver observer;
  observer.stop_after = 3;
  absl::Status s = Trainer(TinyModel(), Quick(50), Chain(1), c10::Device(c10::kCPU), &observer).Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(observer.reports.size(), 3u);
}

TEST(TrainerTest, DivergenceFailsWithAnActionableMessage) {
  RecordingObserver observer;
  TrainOptions o = Quick(30);
  o.lr = 1e6;
  o.min_lr = 1e6;
  o.warmup_steps = 0;
  o.grad_clip = 0;
  absl::Status s = Trainer(TinyModel(), o, Chain(1), c10::Device(c10::kCPU), &observer).Run();
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("train.lr"), std::string::npos);
}

}  // namespace
}  // namespace ferry
