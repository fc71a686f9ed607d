#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/data/token_source.h"
#include "engine/memory/chunk_manager.h"
#include "engine/memory/memory_device.h"
#include "engine/model/model_config.h"
#include "engine/parallel/communicator.h"
#include "engine/train/train_options.h"
#include "engine/train/training_observer.h"

namespace ferry {

struct EngineOptions {
  // Where to train. Required; must outlive the trainer.
  MemoryDevice* device = nullptr;
  // Model data in chunks placed by the memory manager (the default). Unset:
  // the plain LibTorch loop, with the whole model on the device (the
  // baseline the manager is measured against).
  std::optional<MemoryOptions> memory = MemoryOptions();
  // The tensor- and data-parallel groups this rank trains in (null: a
  // group of one); they must outlive the trainer. With T tensor ranks each
  // holds 1/T of the model (see GptImpl); with D data ranks each takes 1/D
  // of every batch (batch_size is the global batch) and gradients are
  // averaged. Every rank samples the same global batch, so training is the
  // same for every T and D. Needs the memory manager.
  Communicator* tensor = nullptr;
  Communicator* data = nullptr;
  // Checkpoints (with the memory manager): start from `resume`, a previous
  // run's checkpoint (this rank's files: model data and optimizer states,
  // update count, loss scaler, random generator, data position), continuing
  // at its step exactly as the uninterrupted run would; and every
  // `checkpoint_every_steps` steps, after the last, and when asked to stop,
  // hand this rank's state to `on_checkpoint` (whose error stops training).
  // The state is taken at the step boundary. Where memory.host_budget has
  // room for a copy of it beside the step's host memory, it is a snapshot
  // in `files`, which the hook owns and may write after it returns (in the
  // background, say) while training goes on; otherwise the chunks' file is
  // in `produced`, read from the live chunks as it is written, and the hook
  // must have written it when it returns (AsyncCheckpointWriter does).
  // `snapshot_seconds` is what taking the snapshot cost the step loop.
  const CheckpointContents* resume = nullptr;
  // Pretrained weights (model.init_from): a safetensors file in Hugging
  // Face's GPT-2 layout holding exactly the model's weights, read as the
  // model is built instead of drawing initial values (hf_import.h); each
  // tensor-parallel rank keeps its part. A resume's checkpoint wins over it.
  std::string init_from;
  // Held-out data to evaluate on (TrainOptions::eval_every_steps), or null
  // for none. Each evaluation restores the position it had when training
  // started, so that every one sees the same windows. Must outlive Run().
  TokenSource* eval_data = nullptr;
  int64_t checkpoint_every_steps = 0;
  std::function<absl::Status(CheckpointContents contents, double snapshot_seconds)> on_checkpoint;
};

// The step loop: sample a batch, forward, backward, clip, AdamW step, report.
// Deterministic for a given seed, data source and thread count; the chunked
// and the plain loop give the same losses bit for bit when gradients are not
// clipped (clipping sums the norm in another order).
class Trainer {
 public:
  // `observer` must outlive the trainer.
  Trainer(ModelConfig model, TrainOptions options, EngineOptions engine,
          std::unique_ptr<TokenSource> data, TrainingObserver* observer);

  // Trains for options.steps steps. OK when done; CANCELLED when the observer
  // asked to stop; FAILED_PRECONDITION if the loss stops being finite;
  // RESOURCE_EXHAUSTED, with the numbers and what to change, when memory
  // runs out; INTERNAL for LibTorch errors.
  absl::Status Run();

 private:
  absl::Status RunSteps();

  ModelConfig model_config_;
  TrainOptions options_;
  EngineOptions engine_;
  std::unique_ptr<TokenSource> data_;
  TrainingObserver* observer_;
};

}  // namespace ferry
