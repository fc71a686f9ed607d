#pragma once

// Text generation from a trained model: the next token drawn from the
// model's distribution at the last position, appended, repeated.
//
// With the key/value cache (the default) the prompt's forward fills each
// block's cache, and each token after runs the forward of its one position
// against the cached keys and values (InferenceModel::AppendLogits): a
// token's cost does not include recomputing the prefix. When the context
// reaches seq_len positions, the cache starts again from the context's
// last seq_len / 2 tokens. Without it each token runs a whole forward over
// the context window (its last seq_len tokens). Through the chunks each
// forward fetches every stage's chunks. Only the last position's head is
// computed.

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/train/inference_model.h"

namespace ferry {

// How the next token is chosen from the last position's logits.
struct SamplingOptions {
  // Tokens to generate, >= 1.
  int64_t max_tokens = 64;
  // 0: greedy, the most likely token (the lowest id among equals), no
  // randomness. Above 0: softmax(logits / temperature); below 1 sharpens,
  // above flattens.
  double temperature = 1.0;
  // Keep only the k most likely tokens (0: all).
  int64_t top_k = 0;
  // Nucleus sampling: keep the fewest most likely tokens whose probability
  // together reaches top_p, in (0, 1] (1: all). Applied after top_k.
  double top_p = 1.0;
  // The sampler's generator (a CPU Mersenne twister of its own): the same
  // seed, model and prompt give the same tokens.
  uint64_t seed = 0;
  // Generation ends after any of these (the model's end-of-sequence
  // tokens), which is passed on as the last token.
  std::vector<int64_t> stop_tokens;
  // The key/value cache (see above); false: a whole forward a token.
  bool use_cache = true;
};

// INVALID_ARGUMENT naming the field (max_tokens, temperature, top_k, top_p)
// and what to change.
absl::Status ValidateSampling(const SamplingOptions& options);

// Chooses a token from fp32 `logits` ([vocab]) as `options` say, drawing
// from `rng` unless greedy. Deterministic for a given rng state.
int64_t SampleToken(const std::vector<float>& logits, const SamplingOptions& options, std::mt19937_64* rng);

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  // Wall-clock time of the generation loop, and of its first token.
  double seconds = 0;
  double first_token_seconds = 0;
  // True when the callback asked to stop, or a stop token ended it, before
  // max_tokens.
  bool stopped = false;
  // True when a stop token ended it.
  bool stop_token = false;
};

// Generates up to options.max_tokens tokens after `prompt` (at least one
// id, each below the vocabulary), calling `on_token(id)` for each as soon as
// it is chosen; `on_token` returning false stops there. The window the
// model sees is the last seq_len tokens. INVALID_ARGUMENT for an empty
// prompt or an id outside the vocabulary (naming it) and bad options;
// the model's errors as they are.
absl::StatusOr<GenerationStats> Generate(InferenceModel& model, const std::vector<int64_t>& prompt,
                                         const SamplingOptions& options,
                                         const std::function<bool(int64_t token)>& on_token);

}  // namespace ferry
