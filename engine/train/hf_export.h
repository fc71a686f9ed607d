#pragma once

// A trained model's weights as its family's Hugging Face checkpoints name
// and lay them out, for safetensors files: each family's layout lives in
// one place, engine/model/hf_layout.h (GPT-2's in engine/model/gpt2_weights.h,
// which hf_layout.h uses): a fused layer's rows are split back into their
// projections, GPT-2's Conv1D weights transposed, a tied output layer not
// written. Values are the fp32 master weights, whatever precision the job
// trained in.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/model/model_config.h"
#include "engine/train/train_options.h"

namespace ferry {

// The job's weights from its checkpoints: `world_ranks` holds the
// checkpoint of every tensor-parallel rank of data ranks 0 .. data_ranks - 1
// (world rank d * parallel.tensor + t), in world rank order, all of the same
// step: one for a job without parallelism. Data ranks hold the same weights
// unless the job shards its chunks across them (memory.shard), where each
// holds a shard of the mixed-precision masters: pass every data rank's
// then, and data rank 0's alone otherwise (data_ranks 1). Each is restored
// through the chunks training keeps it in (see RestoreParameters: `train`
// and `memory` must be the training's), the shards joined into whole
// tensors, then named and laid out as the family's Hugging Face
// checkpoints (GPT-2's as above; the Llama family's in
// engine/model/hf_layout.h, the fused q/k/v and gate/up rows split back
// into their projections), in the model's order. INVALID_ARGUMENT when a
// checkpoint is of another model, precision or parallel layout.
//
// Each tensor goes to `sink` as it is made, as little-endian F32 values,
// and is dropped before the next: beside the restored weights no more than
// one tensor is held (a writer puts it straight into its file, at the
// place HfExportEntries gives it).
using HfTensorSink = std::function<absl::Status(const std::string& name, const void* data, uint64_t bytes)>;
absl::Status ExportHfWeights(const ModelConfig& model, const TrainOptions& train, const MemoryOptions& memory,
                             const std::vector<const CheckpointContents*>& world_ranks, MemoryDevice* device,
                             int data_ranks, const HfTensorSink& sink);
// The same, every tensor collected (small models; tests).
absl::StatusOr<std::vector<SafetensorsTensor>> ExportHfWeights(
    const ModelConfig& model, const TrainOptions& train, const MemoryOptions& memory,
    const std::vector<const CheckpointContents*>& world_ranks, MemoryDevice* device, int data_ranks = 1);

// The tensors ExportHfWeights makes for `model`: each one's name, dtype
// (F32) and shape, in the family's order (HfTensors).
std::vector<SafetensorsEntry> HfExportEntries(const ModelConfig& model);

}  // namespace ferry
