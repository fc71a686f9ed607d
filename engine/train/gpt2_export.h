#pragma once

// A trained model's weights as Hugging Face's GPT-2 (transformers'
// GPT2LMHeadModel / GPT2Model) names and lays them out, for a safetensors
// file:
//
//   wte.weight               [vocab_size, hidden]
//   wpe.weight               [seq_len, hidden]
//   h.N.ln_1.weight, .bias   [hidden]
//   h.N.attn.c_attn.weight   [hidden, 3 * hidden]   (columns: q, k, v; heads
//   h.N.attn.c_attn.bias     [3 * hidden]            contiguous within each)
//   h.N.attn.c_proj.weight   [hidden, hidden]
//   h.N.attn.c_proj.bias     [hidden]
//   h.N.ln_2.weight, .bias   [hidden]
//   h.N.mlp.c_fc.weight      [hidden, 4 * hidden]
//   h.N.mlp.c_fc.bias        [4 * hidden]
//   h.N.mlp.c_proj.weight    [4 * hidden, hidden]
//   h.N.mlp.c_proj.bias      [hidden]
//   ln_f.weight, .bias       [hidden]
//
// GPT-2's c_attn, c_proj and c_fc are Conv1D layers, whose weights are
// [in, out]: the transpose of the nn.Linear weights Ferry trains, so those
// are transposed. Ferry's fused q/k/v rows already are GPT-2's order, so
// nothing else is rearranged. The output layer is tied to wte (as in GPT-2)
// and not written; nor are GPT-2's per-block causal-mask buffers
// (h.N.attn.bias, h.N.attn.masked_bias), which are not weights. Values are
// the fp32 master weights, whatever precision the job trained in.

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
absl::StatusOr<std::vector<SafetensorsTensor>> ExportHfWeights(
    const ModelConfig& model, const TrainOptions& train, const MemoryOptions& memory,
    const std::vector<const CheckpointContents*>& world_ranks, MemoryDevice* device, int data_ranks = 1);

// GPT-2's configuration names for `model` (n_layer, n_embd, n_head,
// n_positions, vocab_size, ...), for the safetensors metadata.
std::map<std::string, std::string> Gpt2ConfigMetadata(const ModelConfig& model);

}  // namespace ferry
