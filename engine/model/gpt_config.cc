#include "engine/model/gpt_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace {

struct Preset {
  const char* name;
  GptConfig config;
};

// GPT-2's published sizes, plus two small ones that train on a laptop CPU.
// The small ones use a byte-level vocabulary (256).
const Preset kPresets[] = {
    {"gpt2-tiny", {2, 128, 4, 256, 128, 0.0}},
    {"gpt2-mini", {4, 256, 4, 256, 256, 0.0}},
    {"gpt2-small", {12, 768, 12, 50257, 1024, 0.1}},
    {"gpt2-medium", {24, 1024, 16, 50257, 1024, 0.1}},
    {"gpt2-large", {36, 1280, 20, 50257, 1024, 0.1}},
    {"gpt2-xl", {48, 1600, 25, 50257, 1024, 0.1}},
};

}  // namespace

int64_t GptConfig::ParameterCount() const {
  const int64_t h = hidden;
  const int64_t embeddings = vocab_size * h + seq_len * h;
  // Per block: two LayerNorms (2h each), QKV (3h*h + 3h), attention output
  // (h*h + h), MLP up (4h*h + 4h) and down (4h*h + h).
  const int64_t block = 2 * (2 * h) + (3 * h * h + 3 * h) + (h * h + h) +
                        (4 * h * h + 4 * h) + (4 * h * h + h);
  const int64_t final_norm = 2 * h;
  return embeddings + layers * block + final_norm;
}

std::vector<ParameterShape> GptParameterShapes(const GptConfig& config, int tensor_ranks) {
  const int64_t h = config.hidden;
  const int64_t t = tensor_ranks > 0 ? tensor_ranks : 1;
  std::vector<ParameterShape> shapes;
  shapes.push_back({"wte.weight", config.vocab_size / t * h, 0});  // rows split by vocabulary
  shapes.push_back({"wpe.weight", config.seq_len * h, 0});
  for (int64_t i = 0; i < config.layers; ++i) {
    const std::string b = absl::StrCat("h.", i, ".");
    const int stage = static_cast<int>(1 + i);
    // Column-parallel layers split their output rows (c_attn by heads),
    // row-parallel ones their input columns; biases of row-parallel layers
    // and the norms are whole on every rank.
    for (const auto& [name, numel] : std::vector<std::pair<const char*, int64_t>>{
             {"ln_1.weight", h},
             {"ln_1.bias", h},
             {"attn.c_attn.weight", 3 * h / t * h},
             {"attn.c_attn.bias", 3 * h / t},
             {"attn.c_proj.weight", h * (h / t)},
             {"attn.c_proj.bias", h},
             {"ln_2.weight", h},
             {"ln_2.bias", h},
             {"mlp.c_fc.weight", 4 * h / t * h},
             {"mlp.c_fc.bias", 4 * h / t},
             {"mlp.c_proj.weight", h * (4 * h / t)},
             {"mlp.c_proj.bias", h},
         }) {
      shapes.push_back({b + name, numel, stage});
    }
  }
  const int head = static_cast<int>(config.layers + 1);
  shapes.push_back({"ln_f.weight", h, head});
  shapes.push_back({"ln_f.bias", h, head});
  return shapes;
}

const std::vector<std::string>& GptPresetNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>;
    for (const Preset& p : kPresets) v->push_back(p.name);
    return v;
  }();
  return *names;
}

absl::StatusOr<GptConfig> GptPreset(absl::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return p.config;
  }
  return absl::NotFoundError(absl::StrCat("unknown preset '", name, "'; choose one of ",
                                          absl::StrJoin(GptPresetNames(), ", ")));
}

}  // namespace ferry
