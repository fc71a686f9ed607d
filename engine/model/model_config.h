#pragma once

// The shape of a decoder-only transformer -- GPT-2 or one of the Llama
// family (Llama 2/3, Mistral, Qwen2/2.5/3, TinyLlama) -- free of LibTorch so
// that the daemon and the spec validator can reason about models without
// linking it.
//
// The defaults are GPT-2's architecture: LayerNorm with biases, learned
// positions, fused biased q/k/v, a GELU MLP 4x wide, the output layer tied to
// the token embedding. The Llama family differs only in the fields below.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// How rotary angles are stretched beyond the context a model was trained
// at (config.json's rope_scaling).
struct RopeScaling {
  enum class Type {
    kNone,
    // Positions divided by `factor`.
    kLinear,
    // Llama 3.1's: long wavelengths divided by `factor`, short ones kept,
    // a smooth mix between (see MODELS.md).
    kLlama3,
  };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct ModelConfig {
  // Transformer blocks.
  int64_t layers = 2;
  // Residual stream width.
  int64_t hidden = 128;
  // Query heads.
  int64_t heads = 4;
  // Tokens in the vocabulary.
  int64_t vocab_size = 256;
  // Context length of a training window (the learned position table's size;
  // for rotary positions at most max_positions).
  int64_t seq_len = 128;
  // Dropout probability for embeddings, attention weights and residual paths.
  double dropout = 0.0;

  // Hugging Face's model_type, which also names the layout of its weights:
  // gpt2, llama, mistral, qwen2 or qwen3.
  std::string model_type = "gpt2";
  enum class Norm { kLayerNorm, kRmsNorm };
  Norm norm = Norm::kLayerNorm;
  double norm_eps = 1e-5;
  enum class Positions { kLearned, kRotary };
  Positions positions = Positions::kLearned;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Key/value heads, each shared by heads / kv_heads query heads
  // (grouped-query attention); 0: as many as the query heads.
  int64_t kv_heads = 0;
  // Width of one head; 0: hidden / heads.
  int64_t head_dim = 0;
  // Biases on the q, k and v projections (GPT-2, Qwen2).
  bool qkv_bias = true;
  // Biases on the attention output and the MLP's layers (GPT-2).
  bool proj_bias = true;
  // RMSNorm of each query and key head before the rotation (Qwen3).
  bool qk_norm = false;
  enum class Mlp {
    // down(gelu_tanh(up(x))).
    kGelu,
    // down(silu(gate(x)) * up(x)).
    kSwiGlu,
  };
  Mlp mlp = Mlp::kGelu;
  // Width of the MLP; 0: 4 x hidden.
  int64_t intermediate = 0;
  // The output layer is the token embedding.
  bool tied = true;
  // The longest context the model supports (config.json's
  // max_position_embeddings); 0: seq_len.
  int64_t max_positions = 0;
  // Vocabulary rows of each piece the token embedding (and an untied output
  // layer) is kept in (see VocabPieces); 0: chosen by size. A layout, not
  // the architecture: the model computes the same whatever it is.
  int64_t vocab_piece_rows = 0;

  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t HeadDim() const { return head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0); }
  int64_t Intermediate() const { return intermediate > 0 ? intermediate : 4 * hidden; }
  int64_t MaxPositions() const { return max_positions > 0 ? max_positions : seq_len; }
  bool Rotary() const { return positions == Positions::kRotary; }
  bool Gated() const { return mlp == Mlp::kSwiGlu; }
  // Rows of the fused q/k/v projection: query heads, then key and value heads.
  int64_t QkvRows() const { return (heads + 2 * KvHeads()) * HeadDim(); }

  // Parameters of the model.
  int64_t ParameterCount() const;
};

// The configuration holds together: positive sizes, heads a multiple of the
// key/value heads, hidden = heads x head size where head_dim is not set,
// an even head size under rotary positions, seq_len within max_positions,
// and, for a tensor group of `tensor_ranks`, every split dimension divisible
// by it. INVALID_ARGUMENT naming the field (as model.FIELD) and the fix.
absl::Status CheckModelConfig(const ModelConfig& config, int tensor_ranks = 1);

// The vocabulary's pieces. A large token embedding (llama-3.2-1b's is
// 128256 x 2048) is kept in pieces of consecutive rows, each its own
// parameter ("wte.weight_0", "wte.weight_1", ...; "lm_head.weight_K" for an
// untied output layer) with a stage of its own in the forward and the
// backward, so that no step needs the whole matrix and its gradient at once
// on the device. One piece (the parameter "wte.weight", as always) where
// the matrix has at most 2^26 elements (every GPT-2 but gpt2-xl) or a
// tensor group splits the vocabulary already (`tensor_ranks` > 1); else as
// few pieces as hold at most 2^26 elements each, of equal rows (a multiple
// of 64; the last holds what is left), or of model.vocab_piece_rows rows
// where set.
int VocabPieces(const ModelConfig& config, int tensor_ranks = 1);
// Rows [begin, begin + size) of the vocabulary that piece `k` of `pieces`
// (VocabPieces) holds.
struct VocabRows {
  int64_t begin = 0;
  int64_t size = 0;
};
VocabRows VocabPieceRows(const ModelConfig& config, int pieces, int k);
// The parameter name of piece `k` of `base` ("wte.weight"): `base` itself
// with one piece.
std::string VocabPieceName(const std::string& base, int pieces, int k);
// Whether `name` is a piece "BASE_K" of the embedding or the output layer:
// sets `base` and `k`.
bool ParseVocabPiece(const std::string& name, std::string* base, int* k);

// Which stage of the step is which, as the trainer forms them: the
// embeddings (one stage per vocabulary piece, each adding its piece's
// rows; positions in the first), then one per block, then the head -- one
// stage (the final norm, the output layer and the loss) with one piece, or
// with P pieces the final norm and then one stage per piece, whose
// log-sum-exps are combined after.
struct ModelStages {
  int pieces = 1;
  int64_t layers = 0;

  int embed(int k) const { return k; }
  int block(int64_t i) const { return static_cast<int>(pieces + i); }
  int head() const { return static_cast<int>(pieces + layers); }
  // The stage of output piece `k`.
  int head_piece(int k) const { return pieces == 1 ? head() : head() + 1 + k; }
  int count() const { return head_piece(pieces - 1) + 1; }
  // The block a stage runs, or -1.
  int64_t BlockOf(int stage) const { return stage >= pieces && stage < head() ? stage - pieces : -1; }
  // "the embeddings", "block 3", "the head".
  std::string Describe(int stage) const;
  // The chunk manager's name of a stage: "embed" (or "embed.K" for piece
  // K), "h.3", "head" (the final norm, then "head.K").
  std::string Name(int stage) const;
};
ModelStages StagesOf(const ModelConfig& config, int tensor_ranks = 1);

// One parameter tensor of the model as one tensor-parallel rank holds it.
struct ParameterShape {
  // As the model's named_parameters() names it: "wte.weight",
  // "h.3.attn.c_attn.bias", "ln_f.weight".
  std::string name;
  // Elements this rank holds: a share of the tensors tensor parallelism
  // splits, the whole of the others.
  int64_t numel = 0;
  // The first stage of the forward that uses it (ModelStages); a tied
  // output layer is the token embedding, whose pieces' stages are the
  // embeddings'.
  int stage = 0;
};

// The model's parameters in named_parameters() order, for one of
// `tensor_ranks` ranks (every rank's shapes are the same). `tensor_ranks`
// must divide what the model splits (CheckModelConfig). Lets the daemon
// lay out chunks exactly as the chunk manager will without LibTorch.
std::vector<ParameterShape> ModelParameterShapes(const ModelConfig& config, int tensor_ranks = 1);

// The step's stages (ModelStages) each with the parameters it computes with
// (indices into `shapes`, ModelParameterShapes' list for `tensor_ranks`):
// every parameter in its own stage, and each piece of a tied output layer
// (the token embedding) in its head stage too, last. Lets the daemon see
// each stage's chunks as the chunk manager will.
std::vector<std::vector<int>> ModelStageParameters(const ModelConfig& config,
                                                   const std::vector<ParameterShape>& shapes, int tensor_ranks = 1);

// How tensor parallelism splits parameter `name` (the whole model's
// layout): along `dim` (0: rows, 1: columns; -1: whole on every rank), each
// of `segments` -- consecutive runs of that dimension whose sizes add up
// to it -- split evenly, rank r taking the r-th part of every segment. The
// fused q/k/v rows are three segments (query heads, key heads, value
// heads), the SwiGLU's fused gate/up rows two.
struct TensorSplit {
  int dim = -1;
  std::vector<int64_t> segments;
};
TensorSplit TensorParallelSplit(const ModelConfig& config, const std::string& name);

// The architecture `model_type` names -- gpt2, or llama, mistral, qwen2,
// qwen3 -- with its family's fixed choices set (norm, positions, MLP,
// biases, q/k norms) and every size at its default. NOT_FOUND naming the
// types Ferry implements for another.
absl::StatusOr<ModelConfig> ModelFamily(absl::string_view model_type);

// Names of the built-in presets, smallest first within each family.
const std::vector<std::string>& ModelPresetNames();

// The preset's configuration, or NOT_FOUND naming the presets that exist.
absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name);

}  // namespace ferry
