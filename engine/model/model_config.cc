#include "engine/model/model_config.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace {

// GPT-2's published sizes and two small ones that train on a laptop CPU
// (byte-level vocabulary).
ModelConfig Gpt2(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq_len, double dropout) {
  ModelConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  c.dropout = dropout;
  return c;
}

// The Llama family's shared shape: RMSNorm, rotary positions, grouped-query
// attention without biases, SwiGLU. Trains at 2048 tokens unless told
// otherwise (model.seq_len, up to max_positions).
struct Family {
  const char* model_type;
  int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab;
  bool tied;
  double rope_theta;
  int64_t max_positions;
  double norm_eps;
};
ModelConfig Llama(const Family& f) {
  ModelConfig c = *ModelFamily(f.model_type);
  c.layers = f.layers;
  c.hidden = f.hidden;
  c.heads = f.heads;
  c.kv_heads = f.kv_heads;
  c.head_dim = f.head_dim;
  c.intermediate = f.intermediate;
  c.vocab_size = f.vocab;
  c.tied = f.tied;
  c.rope_theta = f.rope_theta;
  c.max_positions = f.max_positions;
  c.seq_len = std::min<int64_t>(2048, f.max_positions);
  c.norm_eps = f.norm_eps;
  return c;
}
ModelConfig WithLlama3Scaling(ModelConfig c, double factor, int64_t original) {
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = factor;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_positions = original;
  return c;
}
ModelConfig WithSeqLen(ModelConfig c, int64_t seq_len) {
  c.seq_len = seq_len;
  return c;
}

struct Preset {
  std::string name;
  ModelConfig config;
};

// The published config.json shapes (docs/MODELS.md), and small ones of each
// variant that tests and laptops train in seconds (byte-level vocabulary).
const std::vector<Preset>& Presets() {
  static const auto* presets = new std::vector<Preset>{
      {"gpt2-tiny", Gpt2(2, 128, 4, 256, 128, 0.0)},
      {"gpt2-mini", Gpt2(4, 256, 4, 256, 256, 0.0)},
      {"gpt2-small", Gpt2(12, 768, 12, 50257, 1024, 0.1)},
      {"gpt2-medium", Gpt2(24, 1024, 16, 50257, 1024, 0.1)},
      {"gpt2-large", Gpt2(36, 1280, 20, 50257, 1024, 0.1)},
      {"gpt2-xl", Gpt2(48, 1600, 25, 50257, 1024, 0.1)},
      // Untied, grouped queries, Llama 3's rope scaling.
      {"llama-tiny",
       WithSeqLen(WithLlama3Scaling(Llama({"llama", 2, 128, 4, 2, 32, 352, 256, false, 500000, 1024, 1e-5}), 8, 64),
                  128)},
      {"llama-3.2-1b",
       WithLlama3Scaling(Llama({"llama", 16, 2048, 32, 8, 64, 8192, 128256, true, 500000, 131072, 1e-5}), 32, 8192)},
      {"llama-3.2-3b",
       WithLlama3Scaling(Llama({"llama", 28, 3072, 24, 8, 128, 8192, 128256, true, 500000, 131072, 1e-5}), 32, 8192)},
      {"llama-3.1-8b",
       WithLlama3Scaling(Llama({"llama", 32, 4096, 32, 8, 128, 14336, 128256, false, 500000, 131072, 1e-5}), 8, 8192)},
      {"tinyllama-1.1b", Llama({"llama", 22, 2048, 32, 4, 64, 5632, 32000, false, 10000, 2048, 1e-5})},
      {"mistral-tiny", WithSeqLen(Llama({"mistral", 2, 128, 4, 1, 32, 352, 256, false, 10000, 1024, 1e-5}), 128)},
      {"mistral-7b", Llama({"mistral", 32, 4096, 32, 8, 128, 14336, 32000, false, 10000, 32768, 1e-5})},
      // Tied, biased q/k/v.
      {"qwen2-tiny", WithSeqLen(Llama({"qwen2", 2, 128, 4, 2, 32, 352, 256, true, 1000000, 1024, 1e-6}), 128)},
      {"qwen2.5-0.5b", Llama({"qwen2", 24, 896, 14, 2, 64, 4864, 151936, true, 1000000, 32768, 1e-6})},
      {"qwen2.5-1.5b", Llama({"qwen2", 28, 1536, 12, 2, 128, 8960, 151936, true, 1000000, 32768, 1e-6})},
      {"qwen2.5-7b", Llama({"qwen2", 28, 3584, 28, 4, 128, 18944, 152064, false, 1000000, 32768, 1e-6})},
      // Per-head q/k norms; heads x head_dim != hidden.
      {"qwen3-tiny", WithSeqLen(Llama({"qwen3", 2, 128, 4, 2, 48, 352, 256, true, 1000000, 1024, 1e-6}), 128)},
      {"qwen3-0.6b", Llama({"qwen3", 28, 1024, 16, 8, 128, 3072, 151936, true, 1000000, 40960, 1e-6})},
      {"qwen3-1.7b", Llama({"qwen3", 28, 2048, 16, 8, 128, 6144, 151936, true, 1000000, 40960, 1e-6})},
  };
  return *presets;
}

// Rows of the MLP's first layer: [gate; up] under SwiGLU.
int64_t MlpInRows(const ModelConfig& c) { return (c.Gated() ? 2 : 1) * c.Intermediate(); }

}  // namespace

int64_t ModelConfig::ParameterCount() const {
  int64_t n = 0;
  for (const ParameterShape& p : ModelParameterShapes(*this)) n += p.numel;
  return n;
}

absl::Status CheckModelConfig(const ModelConfig& c, int tensor_ranks) {
  auto invalid = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  for (const auto& [field, value] : std::vector<std::pair<const char*, int64_t>>{
           {"layers", c.layers}, {"hidden", c.hidden}, {"heads", c.heads}, {"vocab_size", c.vocab_size},
           {"seq_len", c.seq_len}}) {
    if (value < 1) return invalid("model.", field, ": ", value, " must be at least 1");
  }
  if (c.kv_heads < 0 || c.head_dim < 0 || c.intermediate < 0 || c.max_positions < 0 || c.vocab_piece_rows < 0) {
    return invalid("model: kv_heads, head_dim, intermediate, max_positions and vocab_piece_rows must not be negative");
  }
  if (c.head_dim == 0 && c.hidden % c.heads != 0) {
    return invalid("model.hidden: ", c.hidden, " is not a multiple of model.heads (", c.heads,
                   "); choose hidden = heads x head size");
  }
  if (c.heads % c.KvHeads() != 0) {
    return invalid("model.kv_heads: ", c.KvHeads(), " does not divide model.heads (", c.heads,
                   "); each key/value head serves a whole group of query heads");
  }
  if (c.Rotary() && c.HeadDim() % 2 != 0) {
    return invalid("model.head_dim: ", c.HeadDim(), " is odd; rotary positions rotate pairs of a head's values");
  }
  if (c.seq_len > c.MaxPositions()) {
    return invalid("model.seq_len: ", c.seq_len, " is beyond the ", c.MaxPositions(),
                   " positions the model supports (max_position_embeddings); choose at most that");
  }
  if (c.norm_eps <= 0) return invalid("model.norm_eps: ", c.norm_eps, " must be positive");
  if (c.Rotary() && c.rope_theta <= 0) return invalid("model.rope_theta: ", c.rope_theta, " must be positive");
  if (c.rope_scaling.type != RopeScaling::Type::kNone && c.rope_scaling.factor <= 0) {
    return invalid("model.rope_scaling.factor: ", c.rope_scaling.factor, " must be positive");
  }
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3 &&
      (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor || c.rope_scaling.original_max_positions < 1)) {
    return invalid("model.rope_scaling: llama3 needs high_freq_factor > low_freq_factor and "
                   "original_max_position_embeddings >= 1");
  }
  const int64_t t = std::max(1, tensor_ranks);
  if (t > 1) {
    // Megatron's split: whole heads, whole key/value heads, whole
    // vocabulary rows and MLP columns per rank.
    for (const auto& [field, value] : std::vector<std::pair<const char*, int64_t>>{
             {"heads", c.heads},
             {"kv_heads", c.KvHeads()},
             {"vocab_size", c.vocab_size},
             {"intermediate", c.Intermediate()}}) {
      if (value % t != 0) {
        return invalid("parallel.tensor: ", t, " ranks cannot split model.", field, " (", value,
                       "); choose a tensor size that divides it");
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Rows of each vocabulary piece but the last (which holds what is left);
// the whole vocabulary where it is one piece.
int64_t RowsPerPiece(const ModelConfig& config, int tensor_ranks) {
  constexpr int64_t kMostElements = int64_t{1} << 26;
  const int64_t v = std::max<int64_t>(config.vocab_size, 1), h = std::max<int64_t>(config.hidden, 1);
  if (tensor_ranks > 1) return v;
  if (config.vocab_piece_rows > 0) return std::min(v, config.vocab_piece_rows);
  if (v * h <= kMostElements) return v;
  // As few pieces as keep each within the bound, of equal rows rounded up
  // to a multiple of 64.
  const int64_t pieces = (v * h + kMostElements - 1) / kMostElements;
  return ((v + pieces - 1) / pieces + 63) / 64 * 64;
}

}  // namespace

int VocabPieces(const ModelConfig& config, int tensor_ranks) {
  const int64_t v = std::max<int64_t>(config.vocab_size, 1), rows = RowsPerPiece(config, tensor_ranks);
  return static_cast<int>((v + rows - 1) / rows);
}

VocabRows VocabPieceRows(const ModelConfig& config, int pieces, int k) {
  if (pieces <= 1) return {0, config.vocab_size};
  const int64_t rows = RowsPerPiece(config, 1);
  const int64_t begin = std::min(config.vocab_size, rows * k);
  return {begin, std::min(rows, config.vocab_size - begin)};
}

std::string VocabPieceName(const std::string& base, int pieces, int k) {
  return pieces <= 1 ? base : absl::StrCat(base, "_", k);
}

bool ParseVocabPiece(const std::string& name, std::string* base, int* k) {
  for (const char* b : {"wte.weight_", "lm_head.weight_"}) {
    absl::string_view rest = name;
    int piece = 0;
    if (absl::ConsumePrefix(&rest, b) && !rest.empty() && absl::SimpleAtoi(rest, &piece) && piece >= 0) {
      *base = std::string(b, std::strlen(b) - 1);
      *k = piece;
      return true;
    }
  }
  return false;
}

std::string ModelStages::Describe(int stage) const {
  if (stage < pieces) return "the embeddings";
  if (stage < head()) return absl::StrCat("block ", stage - pieces);
  return "the head";
}

std::string ModelStages::Name(int stage) const {
  if (stage < pieces) return pieces == 1 ? std::string("embed") : absl::StrCat("embed.", stage);
  if (stage < head()) return absl::StrCat("h.", stage - pieces);
  return stage == head() ? std::string("head") : absl::StrCat("head.", stage - head() - 1);
}

ModelStages StagesOf(const ModelConfig& config, int tensor_ranks) {
  ModelStages s;
  s.pieces = VocabPieces(config, tensor_ranks);
  s.layers = std::max<int64_t>(config.layers, 0);
  return s;
}

std::vector<ParameterShape> ModelParameterShapes(const ModelConfig& config, int tensor_ranks) {
  const int64_t h = config.hidden;
  const int64_t t = tensor_ranks > 0 ? tensor_ranks : 1;
  const bool layer_norm = config.norm == ModelConfig::Norm::kLayerNorm;
  const int64_t attn_width = config.heads * config.HeadDim();  // o_proj's input
  const ModelStages stages = StagesOf(config, static_cast<int>(t));
  // Rows split by vocabulary: across the tensor group, or into pieces.
  auto vocab_rows = [&](int k) {
    return stages.pieces == 1 ? config.vocab_size / t : VocabPieceRows(config, stages.pieces, k).size;
  };
  std::vector<ParameterShape> shapes;
  for (int k = 0; k < stages.pieces; ++k) {
    shapes.push_back({VocabPieceName("wte.weight", stages.pieces, k), vocab_rows(k) * h, stages.embed(k)});
  }
  if (!config.Rotary()) shapes.push_back({"wpe.weight", config.seq_len * h, stages.embed(0)});
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string b = absl::StrCat("h.", i, ".");
    const int stage = stages.block(i);
    auto add = [&](const char* name, int64_t numel) { shapes.push_back({b + name, numel, stage}); };
    // Column-parallel layers split their output rows (c_attn by heads),
    // row-parallel ones their input columns; biases of row-parallel layers
    // and the norms are whole on every rank.
    add("ln_1.weight", h);
    if (layer_norm) add("ln_1.bias", h);
    add("attn.c_attn.weight", config.QkvRows() / t * h);
    if (config.qkv_bias) add("attn.c_attn.bias", config.QkvRows() / t);
    if (config.qk_norm) {
      add("attn.q_norm.weight", config.HeadDim());
      add("attn.k_norm.weight", config.HeadDim());
    }
    add("attn.c_proj.weight", h * (attn_width / t));
    if (config.proj_bias) add("attn.c_proj.bias", h);
    add("ln_2.weight", h);
    if (layer_norm) add("ln_2.bias", h);
    add("mlp.c_fc.weight", MlpInRows(config) / t * h);
    if (config.proj_bias) add("mlp.c_fc.bias", MlpInRows(config) / t);
    add("mlp.c_proj.weight", h * (config.Intermediate() / t));
    if (config.proj_bias) add("mlp.c_proj.bias", h);
  }
  shapes.push_back({"ln_f.weight", h, stages.head()});
  if (layer_norm) shapes.push_back({"ln_f.bias", h, stages.head()});
  for (int k = 0; !config.tied && k < stages.pieces; ++k) {
    shapes.push_back({VocabPieceName("lm_head.weight", stages.pieces, k), vocab_rows(k) * h, stages.head_piece(k)});
  }
  return shapes;
}

TensorSplit TensorParallelSplit(const ModelConfig& config, const std::string& name) {
  if (name == "wte.weight" || name == "lm_head.weight") return {0, {config.vocab_size}};
  if (absl::EndsWith(name, "c_attn.weight") || absl::EndsWith(name, "c_attn.bias")) {
    const int64_t kv = config.KvHeads() * config.HeadDim();
    return {0, {config.heads * config.HeadDim(), kv, kv}};
  }
  if (absl::EndsWith(name, "c_fc.weight") || absl::EndsWith(name, "c_fc.bias")) {
    return config.Gated() ? TensorSplit{0, {config.Intermediate(), config.Intermediate()}}
                          : TensorSplit{0, {config.Intermediate()}};
  }
  if (absl::EndsWith(name, "attn.c_proj.weight")) return {1, {config.heads * config.HeadDim()}};
  if (absl::EndsWith(name, "mlp.c_proj.weight")) return {1, {config.Intermediate()}};
  return {};
}

absl::StatusOr<ModelConfig> ModelFamily(absl::string_view model_type) {
  ModelConfig c;
  if (model_type == "gpt2") return c;
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2" && model_type != "qwen3") {
    return absl::NotFoundError(absl::StrCat("unknown model_type \"", model_type.substr(0, 64),
                                            "\"; choose gpt2, llama, mistral, qwen2 or qwen3"));
  }
  c.model_type = std::string(model_type);
  c.norm = ModelConfig::Norm::kRmsNorm;
  c.positions = ModelConfig::Positions::kRotary;
  c.mlp = ModelConfig::Mlp::kSwiGlu;
  c.qkv_bias = model_type == "qwen2";
  c.proj_bias = false;
  c.qk_norm = model_type == "qwen3";
  c.tied = false;
  return c;
}

const std::vector<std::string>& ModelPresetNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>;
    for (const Preset& p : Presets()) v->push_back(p.name);
    return v;
  }();
  return *names;
}

absl::StatusOr<ModelConfig> ModelPreset(absl::string_view name) {
  for (const Preset& p : Presets()) {
    if (name == p.name) return p.config;
  }
  return absl::NotFoundError(absl::StrCat("unknown preset '", name, "'; choose one of ",
                                          absl::StrJoin(ModelPresetNames(), ", ")));
}

std::vector<std::vector<int>> ModelStageParameters(const ModelConfig& config,
                                                   const std::vector<ParameterShape>& shapes, int tensor_ranks) {
  const ModelStages layout = StagesOf(config, tensor_ranks);
  std::vector<std::vector<int>> stages(static_cast<size_t>(layout.count()));
  std::vector<std::pair<int, int>> tied;  // (head stage, parameter)
  for (size_t i = 0; i < shapes.size(); ++i) {
    stages.at(static_cast<size_t>(shapes[i].stage)).push_back(static_cast<int>(i));
    std::string base;
    int k = 0;
    if (shapes[i].name == "wte.weight") {
      tied.emplace_back(layout.head_piece(0), static_cast<int>(i));
    } else if (ParseVocabPiece(shapes[i].name, &base, &k) && base == "wte.weight") {
      tied.emplace_back(layout.head_piece(k), static_cast<int>(i));
    }
  }
  if (config.tied) {
    for (const auto& [stage, i] : tied) stages.at(static_cast<size_t>(stage)).push_back(i);
  }
  return stages;
}

}  // namespace ferry
