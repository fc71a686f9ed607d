#pragma once

#include <c10/core/Device.h>

#include <memory>

#include "absl/status/status.h"
#include "engine/data/token_source.h"
#include "engine/model/gpt_config.h"
#include "engine/train/train_options.h"
#include "engine/train/training_observer.h"

namespace ferry {

// The step loop: sample a batch, forward, backward, clip, AdamW step, report.
// Deterministic for a given seed, data source and thread count.
class Trainer {
 public:
  // `observer` must outlive the trainer.
  Trainer(GptConfig model, TrainOptions options, std::unique_ptr<TokenSource> data,
          c10::Device device, TrainingObserver* observer);

  // Trains for options.steps steps. OK when done; CANCELLED when the observer
  // asked to stop; FAILED_PRECONDITION if the loss stops being finite;
  // RESOURCE_EXHAUSTED when memory runs out; INTERNAL for LibTorch errors.
  absl::Status Run();

 private:
  GptConfig model_config_;
  TrainOptions options_;
  std::unique_ptr<TokenSource> data_;
  c10::Device device_;
  TrainingObserver* observer_;
};

}  // namespace ferry
