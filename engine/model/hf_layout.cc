#include "engine/model/hf_layout.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status_macros.h"
#include "engine/model/gpt2_weights.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

// A config's token ids: `field` as one id or a list of them; none where it
// is neither.
std::vector<int64_t> TokenIds(const nlohmann::json& j, const char* field) {
  std::vector<int64_t> ids;
  const auto it = j.is_object() ? j.find(field) : j.end();
  if (it == j.end()) return ids;
  if (it->is_number_integer()) ids.push_back(it->get<int64_t>());
  if (it->is_array()) {
    for (const auto& e : *it) {
      if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
    }
  }
  return ids;
}

bool IsLlamaFamily(const std::string& type) {
  return type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3";
}

}  // namespace

std::vector<HfTensor> HfTensors(const ModelConfig& c) {
  std::vector<HfTensor> out;
  if (!IsLlamaFamily(c.model_type)) {
    for (const Gpt2Tensor& t : Gpt2Tensors(c)) out.push_back({t.name, t.shape, t.name, 0, t.transposed});
    return out;
  }
  const int64_t h = c.hidden, hd = c.HeadDim(), q = c.heads * hd, kv = c.KvHeads() * hd, in = c.Intermediate();
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, "wte.weight"});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string hf = absl::StrCat("model.layers.", i, ".");
    const std::string ours = absl::StrCat("h.", i, ".");
    out.push_back({hf + "input_layernorm.weight", {h}, ours + "ln_1.weight"});
    out.push_back({hf + "self_attn.q_proj.weight", {q, h}, ours + "attn.c_attn.weight", 0});
    out.push_back({hf + "self_attn.k_proj.weight", {kv, h}, ours + "attn.c_attn.weight", q});
    out.push_back({hf + "self_attn.v_proj.weight", {kv, h}, ours + "attn.c_attn.weight", q + kv});
    if (c.qkv_bias) {
      out.push_back({hf + "self_attn.q_proj.bias", {q}, ours + "attn.c_attn.bias", 0});
      out.push_back({hf + "self_attn.k_proj.bias", {kv}, ours + "attn.c_attn.bias", q});
      out.push_back({hf + "self_attn.v_proj.bias", {kv}, ours + "attn.c_attn.bias", q + kv});
    }
    if (c.qk_norm) {
      out.push_back({hf + "self_attn.q_norm.weight", {hd}, ours + "attn.q_norm.weight"});
      out.push_back({hf + "self_attn.k_norm.weight", {hd}, ours + "attn.k_norm.weight"});
    }
    out.push_back({hf + "self_attn.o_proj.weight", {h, q}, ours + "attn.c_proj.weight"});
    out.push_back({hf + "post_attention_layernorm.weight", {h}, ours + "ln_2.weight"});
    out.push_back({hf + "mlp.gate_proj.weight", {in, h}, ours + "mlp.c_fc.weight", 0});
    out.push_back({hf + "mlp.up_proj.weight", {in, h}, ours + "mlp.c_fc.weight", in});
    out.push_back({hf + "mlp.down_proj.weight", {h, in}, ours + "mlp.c_proj.weight"});
  }
  out.push_back({"model.norm.weight", {h}, "ln_f.weight"});
  if (!c.tied) out.push_back({"lm_head.weight", {c.vocab_size, h}, "lm_head.weight"});
  return out;
}

bool HfPassedOver(const ModelConfig& config, const std::string& name) {
  if (!IsLlamaFamily(config.model_type)) return Gpt2PassedOver(name);
  // Rotary tables some checkpoints keep, and a tied output layer's copy.
  return absl::EndsWith(name, "rotary_emb.inv_freq") || (config.tied && name == "lm_head.weight");
}

absl::Status CheckHfWeights(const ModelConfig& config, const HfLookup& find,
                            const std::vector<const SafetensorsEntry*>& all, const std::string& what) {
  std::set<const SafetensorsEntry*> used;
  for (const HfTensor& t : HfTensors(config)) {
    const SafetensorsEntry* e = find(t.name);
    if (e == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, " has no ", t.name, " (",
                                                     FormatShape(t.shape),
                                                     " for this model): another architecture, or a damaged file"));
    }
    if (e->shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.init_from: ", what, ": ", t.name, " is ", FormatShape(e->shape), " in the file but ",
          FormatShape(t.shape), " in this model; leave the model's shape fields unset to take them from the model"));
    }
    if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16") {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, ": ", t.name, " is ", e->dtype,
                                                     "; weights must be F32, F16 or BF16"));
    }
    used.insert(e);
  }
  for (const SafetensorsEntry* e : all) {
    if (used.count(e) == 0 && !HfPassedOver(config, e->name)) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, " holds ", e->name, " ",
                                                     FormatShape(e->shape),
                                                     ", which this model has no place for: another architecture, "
                                                     "or more layers than the model"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<HfConfig> ParseHfConfig(const std::string& text, const std::string& what) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: ", what, ": ", parts...));
  };
  if (!j.is_object()) return invalid("not a JSON object; a model folder's config.json is one");
  const auto type_it = j.find("model_type");
  if (type_it == j.end() || !type_it->is_string()) {
    return invalid("no model_type; a Hugging Face config.json names its architecture there");
  }
  const std::string type = type_it->get<std::string>();
  if (type != "gpt2" && !IsLlamaFamily(type)) {
    return invalid("model_type \"", type.substr(0, 64),
                   "\" is not one Ferry implements; choose a model of type llama, mistral, qwen2, qwen3 or gpt2");
  }
  // A positive integer field, or `fallback` where it is absent (-1: required).
  std::string error;
  // The largest each field may be (as a job file's limits: 1024 layers and
  // heads, 65536 wide, a vocabulary of 2^24), so that no size overflows.
  const std::map<std::string, int64_t> limits = {
      {"num_hidden_layers", 1024},       {"n_layer", 1024},          {"num_attention_heads", 1024},
      {"n_head", 1024},                  {"num_key_value_heads", 1024}, {"hidden_size", 65536},
      {"n_embd", 65536},                 {"head_dim", 65536},        {"intermediate_size", 1 << 20},
      {"vocab_size", 1 << 24},           {"n_positions", 1 << 20},   {"max_position_embeddings", int64_t{1} << 31}};
  auto integer = [&](const char* field, int64_t fallback) -> int64_t {
    const auto it = j.find(field);
    if (it == j.end() || it->is_null()) {
      if (fallback < 0 && error.empty()) error = absl::StrCat(field, " is missing; config.json must give it");
      return fallback < 0 ? 1 : fallback;
    }
    const auto limit = limits.find(field);
    const int64_t most = limit != limits.end() ? limit->second : int64_t{1} << 31;
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > most) {
      if (error.empty()) error = absl::StrCat(field, " must be an integer from 1 to ", most);
      return 1;
    }
    return it->get<int64_t>();
  };
  auto number = [&](const char* field, double fallback) -> double {
    const auto it = j.find(field);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number() || !(it->get<double>() > 0 && it->get<double>() <= 1e12)) {
      if (error.empty()) error = absl::StrCat(field, " must be a positive number");
      return fallback;
    }
    return it->get<double>();
  };
  auto flag = [&](const char* field, bool fallback) {
    const auto it = j.find(field);
    return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
  };

  HfConfig out;
  ModelConfig& c = out.model;
  c.model_type = type;
  c.dropout = 0;
  if (type == "gpt2") {
    c.layers = integer("n_layer", -1);
    c.hidden = integer("n_embd", -1);
    c.heads = integer("n_head", -1);
    c.vocab_size = integer("vocab_size", -1);
    c.seq_len = integer("n_positions", 1024);
    c.norm_eps = number("layer_norm_epsilon", 1e-5);
  } else {
    for (const char* moe : {"num_local_experts", "num_experts", "n_routed_experts"}) {
      const auto it = j.find(moe);
      if (it != j.end() && it->is_number() && it->get<double>() > 0) {
        return invalid(moe, " is set: a mixture of experts, which Ferry does not implement; choose a dense model");
      }
    }
    const auto act = j.find("hidden_act");
    if (act != j.end() && act->is_string() && act->get<std::string>() != "silu") {
      return invalid("hidden_act \"", act->get<std::string>().substr(0, 32),
                     "\" is not silu; Ferry's Llama-family MLP is SwiGLU");
    }
    if (flag("mlp_bias", false)) return invalid("mlp_bias is true; Ferry's Llama-family MLP has no biases");
    c = *ModelFamily(type);
    c.dropout = 0;
    c.layers = integer("num_hidden_layers", -1);
    c.hidden = integer("hidden_size", -1);
    c.heads = integer("num_attention_heads", -1);
    c.kv_heads = integer("num_key_value_heads", c.heads);
    c.head_dim = integer("head_dim", c.heads > 0 && c.hidden % c.heads == 0 ? c.hidden / c.heads : -1);
    c.intermediate = integer("intermediate_size", -1);
    c.vocab_size = integer("vocab_size", -1);
    c.max_positions = integer("max_position_embeddings", 2048);
    c.seq_len = std::min<int64_t>(2048, c.max_positions);
    c.norm_eps = number("rms_norm_eps", 1e-6);
    c.rope_theta = number("rope_theta", 10000);
    c.tied = flag("tie_word_embeddings", false);
    if (type != "qwen2" && flag("attention_bias", false)) {
      return invalid("attention_bias is true; Ferry's ", type, " attention has no biases");
    }
    const auto scaling = j.find("rope_scaling");
    if (scaling != j.end() && !scaling->is_null()) {
      if (!scaling->is_object()) return invalid("rope_scaling must be an object or null");
      std::string kind;
      for (const char* key : {"rope_type", "type"}) {
        const auto k = scaling->find(key);
        if (k != scaling->end() && k->is_string()) {
          kind = k->get<std::string>();
          break;
        }
      }
      bool bad = false;
      auto param = [&](const char* key, double fallback) {
        const auto k = scaling->find(key);
        if (k == scaling->end() || k->is_null()) return fallback;
        const double v = k->is_number() ? k->get<double>() : -1;
        if (!(v > 0 && v <= 1e9)) bad = true;
        return bad ? fallback : v;
      };
      RopeScaling& r = c.rope_scaling;
      r.factor = param("factor", 1.0);
      if (kind == "linear") {
        r.type = RopeScaling::Type::kLinear;
      } else if (kind == "llama3") {
        r.type = RopeScaling::Type::kLlama3;
        r.low_freq_factor = param("low_freq_factor", 1.0);
        r.high_freq_factor = param("high_freq_factor", 4.0);
        r.original_max_positions = static_cast<int64_t>(param("original_max_position_embeddings", 8192));
      } else if (kind != "default") {
        return invalid("rope_scaling type \"", kind.substr(0, 32),
                       "\" is not one Ferry implements; it implements linear and llama3");
      }
      if (bad) return invalid("rope_scaling: its factors must be positive numbers");
    }
    const bool windowed = type == "mistral" || flag("use_sliding_window", false);
    const auto window = j.find("sliding_window");
    if (windowed && window != j.end() && window->is_number_integer() && window->get<int64_t>() > 0) {
      out.sliding_window = window->get<int64_t>();
    }
  }
  if (!error.empty()) return invalid(error);
  const auto bos = j.find("bos_token_id");
  if (bos != j.end() && bos->is_number_integer()) out.bos_token_id = bos->get<int64_t>();
  out.eos_token_ids = TokenIds(j, "eos_token_id");
  if (absl::Status s = CheckModelConfig(c); !s.ok()) return invalid(s.message());
  return out;
}

absl::StatusOr<HfConfig> ReadHfFolderConfig(const std::string& dir) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  auto read = [](const std::string& path, std::string* text) {
    std::ifstream in(path);
    if (!in) return false;
    std::stringstream s;
    s << in.rdbuf();
    *text = s.str();
    return true;
  };
  std::string text;
  if (!read(base + "config.json", &text)) {
    return absl::FailedPreconditionError(
        absl::StrCat("model.init_from: ", dir, " has no config.json; give a Hugging Face model folder"));
  }
  ASSIGN_OR_RETURN(HfConfig config, ParseHfConfig(text, base + "config.json"));
  if (read(base + "generation_config.json", &text)) {
    const std::vector<int64_t> eos = TokenIds(nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false),
                                              "eos_token_id");
    if (!eos.empty()) config.eos_token_ids = eos;
  }
  return config;
}

std::string HfConfigJson(const ModelConfig& c, int64_t bos_token_id, const std::vector<int64_t>& eos_token_ids) {
  nlohmann::ordered_json j;
  if (c.model_type == "gpt2") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["n_layer"] = c.layers;
    j["n_embd"] = c.hidden;
    j["n_head"] = c.heads;
    j["n_positions"] = c.seq_len;
    j["n_ctx"] = c.seq_len;
    j["vocab_size"] = c.vocab_size;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["tie_word_embeddings"] = true;
  } else {
    const std::string architecture = c.model_type == "llama"     ? "LlamaForCausalLM"
                                     : c.model_type == "mistral" ? "MistralForCausalLM"
                                     : c.model_type == "qwen2"   ? "Qwen2ForCausalLM"
                                                                 : "Qwen3ForCausalLM";
    j["architectures"] = {architecture};
    j["model_type"] = c.model_type;
    j["hidden_size"] = c.hidden;
    j["num_hidden_layers"] = c.layers;
    j["num_attention_heads"] = c.heads;
    j["num_key_value_heads"] = c.KvHeads();
    j["head_dim"] = c.HeadDim();
    j["intermediate_size"] = c.Intermediate();
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.MaxPositions();
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["tie_word_embeddings"] = c.tied;
    j["hidden_act"] = "silu";
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = false;
    j["attention_dropout"] = 0.0;
    if (c.model_type == "qwen2" || c.model_type == "qwen3") j["use_sliding_window"] = false;
    const RopeScaling& r = c.rope_scaling;
    if (r.type == RopeScaling::Type::kLinear) {
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
    } else if (r.type == RopeScaling::Type::kLlama3) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r.factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"original_max_position_embeddings", r.original_max_positions}};
    } else {
      j["rope_scaling"] = nullptr;
    }
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

absl::Status CheckSlidingWindow(const HfConfig& config, int64_t seq_len) {
  if (config.sliding_window > 0 && config.sliding_window < seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.seq_len: ", seq_len, " is longer than the model's sliding attention window (", config.sliding_window,
        " tokens), which Ferry does not implement; choose seq_len <= ", config.sliding_window));
  }
  return absl::OkStatus();
}

}  // namespace ferry
