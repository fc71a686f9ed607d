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

// Names of the built-in presets, smallest first.
const std::vector<std::string>& GptPresetNames();

// The preset's configuration, or NOT_FOUND naming the presets that exist.
absl::StatusOr<GptConfig> GptPreset(absl::string_view name);

}  // namespace ferry
