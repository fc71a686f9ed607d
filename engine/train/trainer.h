#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
  // model is built instead of drawing initial values (gpt2_import.h); each
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

// Parameters by name.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The fp32 (master) values of the parameters in one rank's checkpoint
// (`checkpoint.files`' "rank<world_rank>.*"), restored through the chunks
// training keeps them in (so `options` and `memory` must be the training's:
// its precision and chunk settings give the layout), named as GptImpl names
// them, on the CPU. With `tensor_ranks` > 1 they are tensor rank
// `tensor_rank`'s shards (see TensorParallelPart). Runs no collectives;
// nothing goes onto `device` (any device: the chunks' host copies hold the
// values). INVALID_ARGUMENT when the checkpoint is of another model,
// precision or layout.
absl::StatusOr<NamedTensors> RestoreParameters(const ModelConfig& model, const TrainOptions& options,
                                               const MemoryOptions& memory, const CheckpointContents& checkpoint,
                                               MemoryDevice* device, int tensor_rank = 0, int tensor_ranks = 1,
                                               int world_rank = 0);
// The same for tensor rank `tensor_rank` of a job with data ranks:
// `data_ranks` holds its checkpoint of each data rank (world rank d *
// tensor_ranks + tensor_rank), in order. Where the job shards its chunks
// across the data ranks (memory.shard) each holds its own shard of the
// mixed-precision masters: every checkpoint is restored as its rank's, the
// ranks run as threads of this process meeting over Gloo, and the shards
// are joined. Otherwise any rank holds the whole and the first is read.
absl::StatusOr<NamedTensors> RestoreParameters(const ModelConfig& model, const TrainOptions& options,
                                               const MemoryOptions& memory,
                                               const std::vector<const CheckpointContents*>& data_ranks,
                                               MemoryDevice* device, int tensor_rank, int tensor_ranks);

// A trained model run forward only, for generation: one process, no
// tensor parallelism (a tensor-parallel job's shards are joined first, as
// gpt2_export.h does). Not thread-safe.
class InferenceModel {
 public:
  virtual ~InferenceModel() = default;
  virtual const ModelConfig& config() const = 0;
  // tokens: [batch, time] int64 on the CPU, 1 <= time <= seq_len -> the fp32
  // logits of each row's last position, [batch, vocab_size], on the CPU
  // (only that position's head is computed). No dropout, no gradients.
  // RESOURCE_EXHAUSTED, saying what to change, out of device memory;
  // INTERNAL for other LibTorch errors.
  virtual absl::StatusOr<at::Tensor> LastLogits(const at::Tensor& tokens) = 0;
  // Generation with a key/value cache: the fp32 logits of the last of
  // `tokens` ([1, time] int64 on the CPU), the positions after those cached
  // so far (none after ResetCache), whose keys and values join the cache.
  // Only the new positions are computed; the cached ones are attended to.
  // INVALID_ARGUMENT past seq_len positions in all.
  virtual absl::StatusOr<at::Tensor> AppendLogits(const at::Tensor& tokens) = 0;
  virtual void ResetCache() = 0;
  virtual int64_t cached_positions() const = 0;
};

// From a checkpoint of a job without tensor parallelism (its "rank0.*"
// files), restored into the chunks training keeps it in (`options` and
// `memory` must be the training's: its precision, chunk settings and, where
// memory.shard shards the chunks across its `data_ranks` data ranks, that
// sharding give the layout) and run through them in the memory manager's evaluation mode
// (ChunkManager::BeginEval): each stage's chunks are fetched onto `device`
// as its forward needs them, so a model larger than the device runs.
// INVALID_ARGUMENT when the checkpoint is of another model, precision or
// layout. `device` must outlive the model.
absl::StatusOr<std::unique_ptr<InferenceModel>> RestoreInferenceModel(const ModelConfig& model,
                                                                      const TrainOptions& options,
                                                                      const MemoryOptions& memory,
                                                                      const CheckpointContents& checkpoint,
                                                                      MemoryDevice* device, int data_ranks = 1);

// From a safetensors file in Hugging Face's GPT-2 layout holding exactly
// `model`'s weights (gpt2_import.h; INVALID_ARGUMENT naming the tensor
// otherwise): with `memory`, in chunks placed by the memory manager as
// above (options.precision gives their type); without, whole on `device`
// in fp32. `device` must outlive the model. An empty `path`: the model's
// own initial values, drawn as a job's first step starts from them (for
// measuring generation without weights to load).
absl::StatusOr<std::unique_ptr<InferenceModel>> LoadInferenceModel(const std::string& path, const ModelConfig& model,
                                                                   const TrainOptions& options,
                                                                   const std::optional<MemoryOptions>& memory,
                                                                   MemoryDevice* device);

}  // namespace ferry
