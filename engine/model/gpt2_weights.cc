#include "engine/model/gpt2_weights.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ferry {
namespace {

// n_head from a config.json beside `path`, or 0.
int64_t HeadsFromConfigJson(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string config = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "config.json";
  std::ifstream in(config);
  if (!in) return 0;
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct json;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &json, options).ok()) return 0;
  auto it = json.fields().find("n_head");
  if (it == json.fields().end() || it->second.kind_case() != google::protobuf::Value::kNumberValue) return 0;
  const double n = it->second.number_value();
  return n >= 1 && n <= 1 << 20 && static_cast<double>(static_cast<int64_t>(n)) == n ? static_cast<int64_t>(n) : 0;
}

}  // namespace

bool Gpt2PassedOver(absl::string_view name) {
  absl::ConsumePrefix(&name, "transformer.");
  return name == "lm_head.weight" ||
         (absl::StartsWith(name, "h.") && (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias")));
}

std::vector<Gpt2Tensor> Gpt2Tensors(const ModelConfig& c) {
  const int64_t h = c.hidden;
  std::vector<Gpt2Tensor> t = {{"wte.weight", {c.vocab_size, h}}, {"wpe.weight", {c.seq_len, h}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string b = absl::StrCat("h.", i, ".");
    for (Gpt2Tensor x : std::vector<Gpt2Tensor>{{"ln_1.weight", {h}},
                                                {"ln_1.bias", {h}},
                                                {"attn.c_attn.weight", {h, 3 * h}, true},
                                                {"attn.c_attn.bias", {3 * h}},
                                                {"attn.c_proj.weight", {h, h}, true},
                                                {"attn.c_proj.bias", {h}},
                                                {"ln_2.weight", {h}},
                                                {"ln_2.bias", {h}},
                                                {"mlp.c_fc.weight", {h, 4 * h}, true},
                                                {"mlp.c_fc.bias", {4 * h}},
                                                {"mlp.c_proj.weight", {4 * h, h}, true},
                                                {"mlp.c_proj.bias", {h}}}) {
      x.name = b + x.name;
      t.push_back(std::move(x));
    }
  }
  t.push_back({"ln_f.weight", {h}});
  t.push_back({"ln_f.bias", {h}});
  return t;
}

const SafetensorsEntry* FindGpt2Tensor(const SafetensorsIndex& index, const std::string& name) {
  const SafetensorsEntry* e = index.Find(name);
  return e != nullptr ? e : index.Find("transformer." + name);
}

absl::StatusOr<ModelConfig> Gpt2ConfigFromWeights(const SafetensorsIndex& index, const std::string& path,
                                                int64_t heads) {
  auto missing = [&](const std::string& name) {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", path, " has no ", name,
                                                   ": it is not a GPT-2 model in Hugging Face's layout"));
  };
  const SafetensorsEntry* wte = FindGpt2Tensor(index, "wte.weight");
  const SafetensorsEntry* wpe = FindGpt2Tensor(index, "wpe.weight");
  if (wte == nullptr) return missing("wte.weight");
  if (wpe == nullptr) return missing("wpe.weight");
  if (wte->shape.size() != 2 || wpe->shape.size() != 2 || wte->shape[1] != wpe->shape[1] || wte->shape[1] <= 0 ||
      wte->shape[0] <= 0 || wpe->shape[0] <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", path, ": wte.weight ", FormatShape(wte->shape),
                                                   " and wpe.weight ", FormatShape(wpe->shape),
                                                   " are not [vocab, hidden] and [context, hidden]"));
  }
  ModelConfig c;
  c.vocab_size = wte->shape[0];
  c.hidden = wte->shape[1];
  c.seq_len = wpe->shape[0];
  c.dropout = 0;
  c.layers = 0;
  while (FindGpt2Tensor(index, absl::StrCat("h.", c.layers, ".ln_1.weight")) != nullptr) ++c.layers;
  if (c.layers == 0) return missing("h.0.ln_1.weight");
  if (heads <= 0) {
    auto it = index.metadata.find("n_head");
    int64_t n = 0;
    if (it != index.metadata.end() && absl::SimpleAtoi(it->second, &n) && n > 0) heads = n;
  }
  if (heads <= 0) heads = HeadsFromConfigJson(path);
  if (heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.init_from: ", path, " does not say how many attention heads the model has (no n_head in its "
        "metadata, no config.json beside it): set model.heads (12 for gpt2, 16 for gpt2-medium, 20 for "
        "gpt2-large, 25 for gpt2-xl)"));
  }
  if (c.hidden % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", path, ": hidden ", c.hidden,
                                                   " does not split into ", heads, " heads; check model.heads"));
  }
  c.heads = heads;
  return c;
}

absl::Status CheckGpt2Weights(const SafetensorsIndex& index, const ModelConfig& config, const std::string& what) {
  std::set<const SafetensorsEntry*> used;
  for (const Gpt2Tensor& t : Gpt2Tensors(config)) {
    const SafetensorsEntry* e = FindGpt2Tensor(index, t.name);
    if (e == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, " has no ", t.name, " (", FormatShape(t.shape),
                                                     " for this model): another architecture, or a damaged file"));
    }
    if (e->shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, ": ", t.name, " is ", FormatShape(e->shape),
                                                     " in the file but ", FormatShape(t.shape),
                                                     " in this model; leave the model's shape fields unset to "
                                                     "take them from the file"));
    }
    if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16") {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, ": ", t.name, " is ", e->dtype,
                                                     "; weights must be F32, F16 or BF16"));
    }
    used.insert(e);
  }
  for (const SafetensorsEntry& e : index.tensors) {
    if (used.count(&e) == 0 && !Gpt2PassedOver(e.name)) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, " holds ", e.name, " ",
                                                     FormatShape(e.shape), ", which this model has no place for: "
                                                     "another architecture, or more layers than the model"));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> Gpt2ConfigMetadata(const ModelConfig& model) {
  return {{"model_type", "gpt2"},
          {"n_layer", absl::StrCat(model.layers)},
          {"n_embd", absl::StrCat(model.hidden)},
          {"n_head", absl::StrCat(model.heads)},
          {"n_positions", absl::StrCat(model.seq_len)},
          {"n_ctx", absl::StrCat(model.seq_len)},
          {"vocab_size", absl::StrCat(model.vocab_size)},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", "1e-05"},
          {"tie_word_embeddings", "true"}};
}

}  // namespace ferry
