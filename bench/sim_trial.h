#pragma once

// A training run on a fresh simulated device, with every report kept: what
// the memory-manager benchmarks measure.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/model_config.h"
#include "engine/train/trainer.h"

namespace ferry {

class Collector : public TrainingObserver {
 public:
  void OnStep(const StepReport& r) override { reports.push_back(r); }
  void OnPlacement(const PlacementReport& p) override { placement = p; }
  std::vector<StepReport> reports;
  PlacementReport placement;
};

struct Trial {
  absl::Status status;
  Collector observer;
};

// Steady steps: the warm-up (step 1) and the step that settles the plan
// (step 2) left out.
constexpr size_t kFirstSteadyStep = 2;

inline std::vector<double> SteadyStepSeconds(const std::vector<StepReport>& reports) {
  std::vector<double> s;
  for (size_t i = kFirstSteadyStep; i < reports.size(); ++i) s.push_back(reports[i].step_seconds);
  return s;
}

// The median (upper of the middle two), or 0 for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Where a step's time went: computing (the forward and backward, less the
// chunk copies made in them), the update less its wait for the disk, the
// wait for the disk, and the chunk copies that held compute up.
struct StepSplit {
  double compute = 0, optimizer = 0, exposed_disk = 0, exposed_transfer = 0;
};

inline StepSplit SplitOf(const StepReport& r) {
  const StepReport::Times& t = r.times;
  StepSplit s;
  s.compute = std::max(0.0, t.forward + t.backward - r.memory_stats.transfer_seconds);
  s.optimizer = std::max(0.0, t.optimizer - t.disk);
  s.exposed_disk = t.disk;
  s.exposed_transfer = r.memory_stats.transfer_seconds;
  return s;
}

// `steps` steps of batch `batch` on `device` and synthetic data, AdamW with
// a short warm-up; `memory` unset runs the plain LibTorch loop (fp32 only:
// mixed precision needs the chunked engine); each step's batch as
// `grad_accum_steps` micro-batches, on `threads` intra-op threads (0:
// LibTorch's default).
inline std::unique_ptr<Trial> TrainOn(MemoryDevice* device, const ModelConfig& model, int64_t steps, int64_t batch,
                                      std::optional<MemoryOptions> memory,
                                      TrainOptions::Precision precision = TrainOptions::Precision::kFp32,
                                      int64_t grad_accum_steps = 1, int threads = 0) {
  auto trial = std::make_unique<Trial>();
  TrainOptions train;
  train.steps = steps;
  train.batch_size = batch;
  train.lr = 1e-3;
  train.min_lr = 1e-4;
  train.warmup_steps = 1;
  train.precision = precision;
  train.grad_accum_steps = grad_accum_steps;
  train.threads = threads;
  EngineOptions engine;
  engine.device = device;
  engine.memory = memory;
  trial->status = Trainer(model, train, engine,
                          std::make_unique<SyntheticSource>(model.vocab_size, 2, 1, 1), &trial->observer)
                      .Run();
  return trial;
}

// The same on a simulated device of `device_bytes`.
inline std::unique_ptr<Trial> TrainOnSimulatedDevice(
    const ModelConfig& model, int64_t steps, int64_t batch, uint64_t device_bytes, std::optional<MemoryOptions> memory,
    TrainOptions::Precision precision = TrainOptions::Precision::kFp32, int64_t grad_accum_steps = 1) {
  SimulatedDevice device(device_bytes);
  return TrainOn(&device, model, steps, batch, memory, precision, grad_accum_steps);
}

}  // namespace ferry
