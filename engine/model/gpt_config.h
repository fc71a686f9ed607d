#pragma once

// The shape of a GPT, free of LibTorch so that the daemon and the spec
// validator can reason about models without linking it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct GptConfig {
  // Transformer blocks.
  int64_t layers = 2;
  // Residual stream width; a multiple of `heads`.
  int64_t hidden = 128;
  int64_t heads = 4;
  // Tokens in the vocabulary.
  int64_t vocab_size = 256;
  // Context length (size of the learned position table).
  int64_t seq_len = 128;
  // Dropout probability for embeddings, attention weights and residual paths.
  double dropout = 0.0;

  // Parameters of the model (the output layer is tied to the token embedding,
  // so it adds none).
  int64_t ParameterCount() const;
};

// One parameter tensor of the model as one tensor-parallel rank holds it.
struct ParameterShape {
  // As the model's named_parameters() names it: "wte.weight",
  // "h.3.attn.c_attn.bias", "ln_f.weight".
  std::string name;
  // Elements this rank holds: a share of the tensors tensor parallelism
  // splits, the whole of the others.
  int64_t numel = 0;
  // The first stage of the forward that uses it, as the trainer forms
  // stages: 0 the embeddings, 1 + i block i, layers + 1 the head (the final
  // norm; its output layer is the token embedding, whose stage is 0).
  int stage = 0;
};

// The model's parameters in named_parameters() order, for one of
// `tensor_ranks` ranks (every rank's shapes are the same). `tensor_ranks`
// must divide heads and vocab_size, as the model requires. Lets the daemon
// lay out chunks exactly as the chunk manager will without LibTorch.
std::vector<ParameterShape> GptParameterShapes(const GptConfig& config, int tensor_ranks = 1);

// Names of the built-in presets, smallest first.
const std::vector<std::string>& GptPresetNames();

// The preset's configuration, or NOT_FOUND naming the presets that exist.
absl::StatusOr<GptConfig> GptPreset(absl::string_view name);

}  // namespace ferry
