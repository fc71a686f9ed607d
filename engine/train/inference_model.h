#pragma once

// A trained model run forward only, for generation, and the ways to get
// one: from a job's checkpoint, or from a weights file.

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/model/model_config.h"
#include "engine/train/train_options.h"

namespace ferry {

// A trained model run forward only, for generation: one process, no
// tensor parallelism (a tensor-parallel job's shards are joined first, as
// hf_export.h does). Not thread-safe.
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
// `model`'s weights (hf_import.h; INVALID_ARGUMENT naming the tensor
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
