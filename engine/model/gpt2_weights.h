#pragma once

// Pretrained weights in the Hugging Face GPT-2 layout (what `ferry export`
// writes and what GPT-2-family checkpoints hold, as safetensors): the names
// and shapes a model of a given configuration has there, the configuration a
// file's tensors imply, and the check that a file holds exactly the model.
// No LibTorch, so that the daemon can check a file at submit.
//
// GPT-2's tensors, for L layers, hidden H, vocabulary V, context S:
//   wte.weight [V, H], wpe.weight [S, H]
//   h.N.ln_1.weight/.bias [H]        h.N.ln_2.weight/.bias [H]
//   h.N.attn.c_attn.weight [H, 3H]   h.N.attn.c_attn.bias [3H]
//   h.N.attn.c_proj.weight [H, H]    h.N.attn.c_proj.bias [H]
//   h.N.mlp.c_fc.weight [H, 4H]      h.N.mlp.c_fc.bias [4H]
//   h.N.mlp.c_proj.weight [4H, H]    h.N.mlp.c_proj.bias [H]
//   ln_f.weight/.bias [H]
// The Conv1D weights (c_attn, c_proj, c_fc) are [in, out], the transpose of
// the Linear weights Ferry trains. A file may also hold what is not a
// weight -- the blocks' causal-mask buffers (h.N.attn.bias,
// h.N.attn.masked_bias) and the output layer tied to wte (lm_head.weight)
// -- which are passed over, and may prefix every name with "transformer.".

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/model_config.h"

namespace ferry {

struct Gpt2Tensor {
  // As GPT-2 (and the model's named_parameters()) names it.
  std::string name;
  // GPT-2's layout.
  std::vector<int64_t> shape;
  // Stored transposed from Ferry's layout (a Conv1D weight).
  bool transposed = false;
};

// What a GPT-2 file may hold that is not a weight: the blocks' causal-mask
// buffers and the output layer tied to wte.
bool Gpt2PassedOver(absl::string_view name);

// The model's tensors in named_parameters() order, in GPT-2's layout.
std::vector<Gpt2Tensor> Gpt2Tensors(const ModelConfig& config);

// The file's entry for `name`, under its own name or "transformer." + name;
// null if neither is there.
const SafetensorsEntry* FindGpt2Tensor(const SafetensorsIndex& index, const std::string& name);

// The configuration `index`'s tensors imply: layers from the blocks, hidden
// and vocabulary from wte, context from wpe. Heads cannot be read from
// shapes: `heads` if > 0, else the file's metadata n_head (`ferry export`
// writes it), else the n_head of a config.json beside `path`; else
// INVALID_ARGUMENT saying to set model.heads. Dropout is left at 0.
// INVALID_ARGUMENT naming what is missing when wte, wpe or block 0 is not
// there.
absl::StatusOr<ModelConfig> Gpt2ConfigFromWeights(const SafetensorsIndex& index, const std::string& path, int64_t heads);

// Every tensor of `config` is in `index` with its GPT-2 shape, as F32, F16
// or BF16, and the file holds no other weight: else INVALID_ARGUMENT naming
// the tensor (and both shapes, for a shape that differs) and `what`.
absl::Status CheckGpt2Weights(const SafetensorsIndex& index, const ModelConfig& config, const std::string& what);

// GPT-2's configuration names for `model` (n_layer, n_embd, n_head,
// n_positions, vocab_size, ...), for a safetensors file's metadata.
std::map<std::string, std::string> Gpt2ConfigMetadata(const ModelConfig& model);

}  // namespace ferry
