#pragma once

// A job's parameters restored from its checkpoints, through the chunks it
// was trained in.

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/model/model_config.h"
#include "engine/train/train_options.h"

namespace ferry {

// Parameters by name.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The fp32 (master) values of the parameters in one rank's checkpoint
// (`checkpoint.files`' "rank<world_rank>.*"), restored through the chunks
// training keeps them in (so `options` and `memory` must be the training's:
// its precision and chunk settings give the layout), named as GptImpl names
// them -- with a vocabulary kept in pieces (VocabPieces) joined into the
// whole "wte.weight" (and "lm_head.weight") -- on the CPU. With `tensor_ranks` > 1 they are tensor rank
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

}  // namespace ferry
