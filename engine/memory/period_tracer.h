#pragma once

// The step's memory trace: how much non-model memory (activations,
// workspace) each period of the step needs, measured in a warm-up step and
// kept as the prediction for the steady steps after it; which stages
// recompute their activations; and what each period of the current step
// measured and moved. No device access: the manager hands it the figures.
//
// A warm-up runs whenever the batch shape differs from the last traced one.
// With recompute auto the warm-up recomputes every recomputable stage and
// measures, per stage, what keeping its activations would add; after it,
// ChooseRecompute stops recomputing stages while the step still fits.
//
// Not thread-safe: one training loop drives it.

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/memory/chunk_table.h"
#include "engine/memory/memory_options.h"
#include "engine/memory/placement_report.h"

namespace ferry {

class PeriodTracer {
 public:
  // What one period of the current (then last) step measured and moved.
  struct Measure {
    uint64_t non_model_bytes = 0;
    uint64_t device_model_bytes = 0;
    int evictions = 0;
    int fetches = 0;
    int prefetches = 0;
  };

  // `table` (its stages and period numbering) must outlive the tracer.
  PeriodTracer(const ChunkTable* table, const MemoryOptions& options);

  // Starts a step. Returns true when its batch shape differs from the last
  // traced one: this step is then a warm-up, with a fresh trace and every
  // stage recomputing that the options allow.
  bool BeginStep(const std::vector<int64_t>& batch_shape);
  // The step is over: the next one is steady unless its shape differs.
  void EndStep() { warmup_ = false; }
  bool warmup() const { return warmup_; }

  // A period starts (its chunks are then fetched); measuring starts once
  // they are, with `device_model_bytes` of model data on the device; it ends
  // with the device's peak allocation since then. During a warm-up the peak
  // beyond the model data is recorded; afterwards it is compared with the
  // prediction (the error goes to `stats`) and raises it if larger.
  void EnterPeriod(int period) { current_period_ = period; }
  void StartMeasuring(uint64_t device_model_bytes);
  void EndPeriod(int period, uint64_t peak_allocated_bytes, StepMemoryStats* stats);
  // The period running now; -1 between periods.
  int current_period() const { return current_period_; }
  // Moves in the current period (an eviction in `period`).
  void CountEviction(int period);
  void CountFetch(bool prefetch);

  // The non-model memory planned for `period` (0 before any plan).
  uint64_t Predicted(int period) const;
  const std::vector<uint64_t>& predicted() const { return predicted_; }
  const std::vector<uint64_t>& warmup_trace() const { return non_model_; }
  const std::vector<Measure>& step_periods() const { return step_periods_; }

  // Recompute, per stage.
  const std::vector<bool>& recompute() const { return recompute_; }
  bool Recomputes(int stage) const { return recompute_[static_cast<size_t>(stage)]; }
  std::vector<int> RecomputedStages() const;
  // A recomputing stage's input, and what its re-run keeps beyond what it
  // held before (the largest seen).
  void RecordInput(int stage, uint64_t bytes);
  void RecordKept(int stage, uint64_t bytes);
  // The warm-up trace as it would be with only `recompute` recomputing.
  std::vector<uint64_t> TraceWith(const std::vector<bool>& recompute) const;
  // After a warm-up: with recompute auto, stops recomputing stages -- those
  // whose activations cost least first, the later on ties (they live for
  // fewer periods) -- while `fits` accepts the trace; then predicts the
  // trace of the stages that still recompute.
  void ChooseRecompute(const std::function<bool(const std::vector<uint64_t>& trace)>& fits);

 private:
  std::vector<bool> InitialRecompute() const;
  // What keeping `stage`'s activations adds to every period from its
  // forward to its backward, as the warm-up measured it.
  uint64_t KeepCost(int stage) const;

  const ChunkTable* table_;
  MemoryOptions options_;
  bool warmup_ = true;
  std::vector<int64_t> traced_shape_;
  std::vector<uint64_t> non_model_;  // per period, from the last warm-up
  std::vector<uint64_t> predicted_;  // per period, for steady steps
  std::vector<bool> recompute_;          // per stage, now
  std::vector<bool> traced_recompute_;   // per stage, in the warm-up
  std::vector<uint64_t> kept_activation_bytes_;
  std::vector<uint64_t> input_bytes_;
  std::vector<Measure> step_periods_;
  int current_period_ = -1;
  uint64_t period_model_bytes_ = 0;
};

}  // namespace ferry
