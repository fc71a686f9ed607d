#pragma once

// A training run on a fresh simulated device, with every report kept: what
// the memory-manager benchmarks measure.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt_config.h"
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

// `steps` steps of batch `batch` on synthetic data, AdamW with a short
// warm-up; `memory` unset runs the plain LibTorch loop.
inline std::unique_ptr<Trial> TrainOnSimulatedDevice(const GptConfig& model, int64_t steps, int64_t batch,
                                                     uint64_t device_bytes, std::optional<MemoryOptions> memory) {
  auto trial = std::make_unique<Trial>();
  SimulatedDevice device(device_bytes);
  TrainOptions train;
  train.steps = steps;
  train.batch_size = batch;
  train.lr = 1e-3;
  train.min_lr = 1e-4;
  train.warmup_steps = 1;
  EngineOptions engine;
  engine.device = &device;
  engine.memory = memory;
  trial->status = Trainer(model, train, engine,
                          std::make_unique<SyntheticSource>(model.vocab_size, 2, 1, 1), &trial->observer)
                      .Run();
  return trial;
}

}  // namespace ferry
