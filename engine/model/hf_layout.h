#pragma once

// Each family's Hugging Face layout in one place: the tensors a model of a
// given configuration has in a Hugging Face checkpoint, and which of the
// model's parameters (see gpt.h) each fills. Reading config.json into a
// ModelConfig lives here too. No LibTorch, so that the daemon can check a
// model folder at submit.
//
// The Llama family (llama, mistral, qwen2, qwen3), for layer i:
//   model.embed_tokens.weight [V, H]                  -> wte.weight
//   model.layers.i.input_layernorm.weight [H]         -> h.i.ln_1.weight
//   model.layers.i.self_attn.{q,k,v}_proj.weight      -> h.i.attn.c_attn.weight's
//     [heads x hd, H], [kv x hd, H], [kv x hd, H]        query, key, value rows
//   model.layers.i.self_attn.{q,k,v}_proj.bias (qwen2) -> h.i.attn.c_attn.bias's
//   model.layers.i.self_attn.{q,k}_norm.weight (qwen3) -> h.i.attn.{q,k}_norm.weight
//   model.layers.i.self_attn.o_proj.weight [H, heads x hd] -> h.i.attn.c_proj.weight
//   model.layers.i.post_attention_layernorm.weight    -> h.i.ln_2.weight
//   model.layers.i.mlp.{gate,up}_proj.weight [I, H]   -> h.i.mlp.c_fc.weight's gate, up rows
//   model.layers.i.mlp.down_proj.weight [H, I]        -> h.i.mlp.c_proj.weight
//   model.norm.weight                                 -> ln_f.weight
//   lm_head.weight [V, H] (untied only)               -> lm_head.weight
// GPT-2's layout is engine/model/gpt2_weights.h's (the model's own names,
// Conv1D weights transposed).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/model_config.h"

namespace ferry {

struct HfTensor {
  // As the checkpoint names it.
  std::string name;
  // Its shape there.
  std::vector<int64_t> shape;
  // The model's parameter it fills (named_parameters()' name) ...
  std::string param;
  // ... from this row on (a fused layer's part; the rest of the parameter is
  // other tensors'), all of it when the tensor is the whole parameter.
  int64_t row_offset = 0;
  // Stored transposed from the model's layout (GPT-2's Conv1D weights).
  bool transposed = false;
};

// The checkpoint's tensors for `config`, in the order of the model's
// parameters they fill.
std::vector<HfTensor> HfTensors(const ModelConfig& config);

// Tensors a checkpoint may hold that are not weights (or are weights the
// model shares, as a tied output layer): passed over when reading.
bool HfPassedOver(const ModelConfig& config, const std::string& name);

// Looks a tensor up by the checkpoint's name across the files of a model
// (one file, or the shards an index names); null if none holds it.
using HfLookup = std::function<const SafetensorsEntry*(const std::string& name)>;

// Every tensor of `config` is found with its shape, as F32, F16 or BF16,
// and nothing else is (`all` lists what the files hold): else
// INVALID_ARGUMENT naming the tensor (and both shapes, for one that
// differs) and `what`.
absl::Status CheckHfWeights(const ModelConfig& config, const HfLookup& find,
                            const std::vector<const SafetensorsEntry*>& all, const std::string& what);

// The model config.json describes (its text; `what` names it in errors):
// model_type llama, mistral, qwen2, qwen3 or gpt2, with its shapes, norm
// eps, rope_theta and rope_scaling (linear, llama3), tie_word_embeddings,
// max_position_embeddings (seq_len is set to the smaller of it and 2048).
// INVALID_ARGUMENT naming the field and the fix for an unknown model_type,
// a feature Ferry does not implement (mixture of experts, an unknown
// rope_scaling type, attention biases Llama does not have) or a missing
// shape field. A sliding window is recorded for CheckSlidingWindow.
struct HfConfig {
  ModelConfig model;
  // config.json's sliding_window where attention uses one; 0 for none.
  int64_t sliding_window = 0;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
};
absl::StatusOr<HfConfig> ParseHfConfig(const std::string& json, const std::string& what);

// A model folder's config.json (ParseHfConfig), with the end-of-sequence
// tokens of its generation_config.json where it has one. FAILED_PRECONDITION
// for a folder without config.json. The caller confines the paths.
absl::StatusOr<HfConfig> ReadHfFolderConfig(const std::string& dir);

// config.json for `config`, as Hugging Face writes it for its model_type
// (what ParseHfConfig reads back to the same model), with the end-of-
// sequence and beginning-of-sequence tokens where known (-1 / empty: left
// out).
std::string HfConfigJson(const ModelConfig& config, int64_t bos_token_id = -1,
                         const std::vector<int64_t>& eos_token_ids = {});

// A sliding window shorter than the training window changes what attention
// sees, which Ferry does not compute: INVALID_ARGUMENT naming
// model.seq_len and the window.
absl::Status CheckSlidingWindow(const HfConfig& config, int64_t seq_len);

}  // namespace ferry
