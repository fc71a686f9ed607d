#include "engine/memory/period_tracer.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// An embedding, three recomputable blocks and a head: 11 periods (5
// forward, 5 backward, the optimizer).
ChunkTable Stages() {
  ChunkTable table;
  table.stages = {{"embed", {}, false}, {"h.0", {}, true}, {"h.1", {}, true}, {"h.2", {}, true}, {"head", {}, false}};
  return table;
}

MemoryOptions Recompute(MemoryOptions::Recompute mode) {
  MemoryOptions options;
  options.recompute = mode;
  return options;
}

// A warm-up whose period p peaks at `peaks[p]` beyond 10 MiB of model data.
void WarmUp(PeriodTracer& tracer, const std::vector<uint64_t>& peaks) {
  StepMemoryStats stats;
  ASSERT_TRUE(tracer.BeginStep({8, 16}));
  for (size_t p = 0; p < peaks.size(); ++p) {
    tracer.EnterPeriod(static_cast<int>(p));
    tracer.StartMeasuring(10 * kMiB);
    tracer.EndPeriod(static_cast<int>(p), 10 * kMiB + peaks[p], &stats);
  }
  tracer.EndStep();
}

TEST(PeriodTracerTest, TheWarmUpRecomputesWhatTheModeAllows) {
  ChunkTable table = Stages();
  EXPECT_EQ(PeriodTracer(&table, Recompute(MemoryOptions::Recompute::kNone)).RecomputedStages(), std::vector<int>{});
  EXPECT_EQ(PeriodTracer(&table, Recompute(MemoryOptions::Recompute::kAll)).RecomputedStages(),
            (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(PeriodTracer(&table, Recompute(MemoryOptions::Recompute::kAuto)).RecomputedStages(),
            (std::vector<int>{1, 2, 3}));
  MemoryOptions every = Recompute(MemoryOptions::Recompute::kEvery);
  every.recompute_every = 2;
  EXPECT_EQ(PeriodTracer(&table, every).RecomputedStages(), (std::vector<int>{1, 3})) << "blocks 0 and 2";
}

TEST(PeriodTracerTest, AutoKeepsTheCheapestBlocksWhileTheStepFits) {
  ChunkTable table = Stages();
  PeriodTracer tracer(&table, Recompute(MemoryOptions::Recompute::kAuto));
  WarmUp(tracer, std::vector<uint64_t>(11, 4 * kMiB));
  // What keeping each block's activations adds beyond its 1 MiB input:
  // h.0 3 MiB, h.1 1 MiB, h.2 2 MiB.
  for (int s = 1; s <= 3; ++s) tracer.RecordInput(s, kMiB);
  tracer.RecordKept(1, 4 * kMiB);
  tracer.RecordKept(2, 2 * kMiB);
  tracer.RecordKept(3, 3 * kMiB);
  tracer.RecordKept(2, kMiB);  // the largest seen counts
  // Kept from its forward to its backward: h.1 (stage 2) adds 1 MiB to
  // periods 2..6 of the trace.
  std::vector<bool> keep_h1 = {false, true, false, true, false};
  const std::vector<uint64_t> trace = tracer.TraceWith(keep_h1);
  for (int p = 0; p < 11; ++p) EXPECT_EQ(trace[p], (p >= 2 && p <= 6 ? 5 : 4) * kMiB) << p;
  // The step fits while no period needs more than 7 MiB: h.1 (1 MiB) and
  // h.2 (2 MiB) stop recomputing, h.0 (3 MiB more) would not fit.
  std::vector<std::vector<uint64_t>> asked;
  tracer.ChooseRecompute([&](const std::vector<uint64_t>& t) {
    asked.push_back(t);
    for (uint64_t b : t) {
      if (b > 7 * kMiB) return false;
    }
    return true;
  });
  EXPECT_EQ(asked.size(), 3u) << "one trial a recomputing block";
  EXPECT_EQ(tracer.RecomputedStages(), std::vector<int>{1});
  // The prediction is the trace with those kept.
  EXPECT_EQ(tracer.Predicted(2), 5 * kMiB) << "h.1's forward: h.1 kept";
  EXPECT_EQ(tracer.Predicted(3), 7 * kMiB) << "h.2's forward: both kept";
  EXPECT_EQ(tracer.Predicted(0), 4 * kMiB);
  EXPECT_EQ(tracer.Predicted(10), 4 * kMiB);
}

TEST(PeriodTracerTest, SteadyStepsCompareWithThePredictionAndRaiseIt) {
  ChunkTable table = Stages();
  PeriodTracer tracer(&table, Recompute(MemoryOptions::Recompute::kNone));
  WarmUp(tracer, std::vector<uint64_t>(11, 4 * kMiB));
  tracer.ChooseRecompute([](const std::vector<uint64_t>&) { return true; });
  EXPECT_FALSE(tracer.BeginStep({8, 16})) << "the same shape: a steady step";
  EXPECT_FALSE(tracer.warmup());
  StepMemoryStats stats;
  tracer.EnterPeriod(5);
  tracer.StartMeasuring(10 * kMiB);
  tracer.CountFetch(/*prefetch=*/false);
  tracer.CountFetch(/*prefetch=*/true);
  tracer.CountEviction(5);
  tracer.EndPeriod(5, 16 * kMiB, &stats);
  EXPECT_EQ(tracer.current_period(), -1);
  EXPECT_DOUBLE_EQ(stats.prediction_error, 0.5) << "6 MiB measured, 4 predicted";
  EXPECT_EQ(tracer.Predicted(5), 6 * kMiB) << "raised to what was measured";
  EXPECT_EQ(stats.peak_non_model_bytes, 6 * kMiB);
  const PeriodTracer::Measure& m = tracer.step_periods()[5];
  EXPECT_EQ(m.fetches, 1);
  EXPECT_EQ(m.prefetches, 1);
  EXPECT_EQ(m.evictions, 1);
  EXPECT_EQ(m.device_model_bytes, 10 * kMiB);
  // A new batch shape starts a warm-up over.
  EXPECT_TRUE(tracer.BeginStep({4, 16}));
  EXPECT_TRUE(tracer.warmup());
  EXPECT_EQ(tracer.warmup_trace(), std::vector<uint64_t>(11, 0));
}

}  // namespace
}  // namespace ferry
