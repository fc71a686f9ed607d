#include "engine/model/hf_layout.h"

#include <gtest/gtest.h>

#include <map>

namespace ferry {
namespace {

// Llama-3.2-1B's config.json as published (abridged of fields Ferry
// ignores).
constexpr char kLlama32[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "vocab_size": 32000})";

// A published config.json reads as the preset of the same model, but for
// the context it trains at.
void ExpectSameShape(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.ParameterCount(), b.ParameterCount());
  EXPECT_EQ(a.KvHeads(), b.KvHeads());
  EXPECT_EQ(a.HeadDim(), b.HeadDim());
  EXPECT_EQ(a.tied, b.tied);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.MaxPositions(), b.MaxPositions());
}

TEST(HfLayoutTest, PublishedConfigsReadAsTheirPresets) {
  for (const auto& [json, preset] : std::vector<std::pair<const char*, const char*>>{
           {kLlama32, "llama-3.2-1b"}, {kQwen25, "qwen2.5-0.5b"}, {kQwen3, "qwen3-0.6b"}, {kMistral, "mistral-7b"}}) {
    SCOPED_TRACE(preset);
    absl::StatusOr<HfConfig> c = ParseHfConfig(json, "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectSameShape(c->model, *ModelPreset(preset));
    EXPECT_EQ(c->model.seq_len, 2048);
  }
  const HfConfig llama = *ParseHfConfig(kLlama32, "config.json");
  EXPECT_EQ(llama.bos_token_id, 128000);
  EXPECT_EQ(llama.eos_token_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(llama.sliding_window, 0);
  // Qwen2.5's window is off (use_sliding_window false); Mistral's is 4096.
  EXPECT_EQ(ParseHfConfig(kQwen25, "c")->sliding_window, 0);
  const HfConfig mistral = *ParseHfConfig(kMistral, "c");
  EXPECT_TRUE(CheckSlidingWindow(mistral, 4096).ok());
  const absl::Status longer = CheckSlidingWindow(mistral, 8192);
  EXPECT_NE(longer.message().find("model.seq_len: 8192"), std::string::npos) << longer;
}

TEST(HfLayoutTest, WrittenConfigsReadBackAsTheSameModel) {
  for (const std::string& name : ModelPresetNames()) {
    SCOPED_TRACE(name);
    ModelConfig preset = *ModelPreset(name);
    if (preset.model_type != "gpt2") preset.seq_len = std::min<int64_t>(2048, preset.MaxPositions());
    absl::StatusOr<HfConfig> back = ParseHfConfig(HfConfigJson(preset, 1, {2, 3}), "config.json");
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameShape(back->model, preset);
    EXPECT_EQ(back->model.seq_len, preset.seq_len);
    EXPECT_EQ(back->bos_token_id, 1);
    EXPECT_EQ(back->eos_token_ids, (std::vector<int64_t>{2, 3}));
  }
}

TEST(HfLayoutTest, WhatFerryDoesNotImplementIsRefusedNamingTheField) {
  const std::map<std::string, std::string> refused = {
      {R"({"model_type": "mixtral", "hidden_size": 8})", "model_type \"mixtral\""},
      {R"({"hidden_size": 8})", "no model_type"},
      {"[1, 2]", "not a JSON object"},
      {"{not json", "not a JSON object"},
      {R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 256, "rope_scaling": {"rope_type": "yarn", "factor": 4}})",
       "rope_scaling type \"yarn\""},
      {R"({"model_type": "qwen2", "num_experts": 8})", "num_experts"},
      {R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 256})",
       "num_hidden_layers is missing"},
      {R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 3, "intermediate_size": 128, "vocab_size": 256})",
       "model.kv_heads"},
      {R"({"model_type": "llama", "num_hidden_layers": -2})", "num_hidden_layers must be an integer from 1 to 1024"},
      {R"({"model_type": "llama", "attention_bias": true, "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256})",
       "attention_bias"},
  };
  for (const auto& [json, says] : refused) {
    absl::StatusOr<HfConfig> c = ParseHfConfig(json, "m/config.json");
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(says), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find("model.init_from: m/config.json"), std::string::npos) << c.status();
  }
}

// Entries as a file would list them, from the layout itself.
std::vector<SafetensorsEntry> EntriesOf(const ModelConfig& c) {
  std::vector<SafetensorsEntry> out;
  for (const HfTensor& t : HfTensors(c)) {
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = "BF16";
    e.shape = t.shape;
    out.push_back(e);
  }
  return out;
}

absl::Status Check(const ModelConfig& c, const std::vector<SafetensorsEntry>& entries) {
  std::vector<const SafetensorsEntry*> all;
  for (const SafetensorsEntry& e : entries) all.push_back(&e);
  return CheckHfWeights(
      c,
      [&](const std::string& name) -> const SafetensorsEntry* {
        for (const SafetensorsEntry& e : entries) {
          if (e.name == name) return &e;
        }
        return nullptr;
      },
      all, "m");
}

TEST(HfLayoutTest, TensorsFillEveryParameterExactlyOnce) {
  for (const char* name : {"llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "gpt2-tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = *ModelPreset(name);
    // Each parameter's tensors tile its rows, in order, and fill all of it.
    std::map<std::string, int64_t> next_row, filled;
    for (const HfTensor& t : HfTensors(c)) {
      EXPECT_EQ(t.row_offset, next_row[t.param]) << t.name;
      next_row[t.param] += t.transposed ? t.shape[1] : t.shape[0];
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      filled[t.param] += numel;
    }
    EXPECT_EQ(filled.size(), ModelParameterShapes(c).size());
    for (const ParameterShape& p : ModelParameterShapes(c)) EXPECT_EQ(filled[p.name], p.numel) << p.name;
    EXPECT_TRUE(Check(c, EntriesOf(c)).ok()) << Check(c, EntriesOf(c));
  }
}

TEST(HfLayoutTest, MissingExtraMisshapenAndMistypedTensorsAreNamed) {
  const ModelConfig c = *ModelPreset("llama-tiny");
  std::vector<SafetensorsEntry> missing = EntriesOf(c);
  missing.erase(missing.begin() + 3);
  EXPECT_NE(Check(c, missing).message().find("has no " + EntriesOf(c)[3].name), std::string::npos);

  std::vector<SafetensorsEntry> extra = EntriesOf(c);
  extra.push_back(extra[1]);
  extra.back().name = "model.layers.2.input_layernorm.weight";
  EXPECT_NE(Check(c, extra).message().find("holds model.layers.2.input_layernorm.weight"), std::string::npos);

  std::vector<SafetensorsEntry> misshapen = EntriesOf(c);
  misshapen[2].shape = {7, 7};
  const absl::Status shape = Check(c, misshapen);
  EXPECT_NE(shape.message().find(misshapen[2].name + " is [7, 7] in the file but"), std::string::npos) << shape;

  std::vector<SafetensorsEntry> mistyped = EntriesOf(c);
  mistyped[0].dtype = "I8";
  EXPECT_NE(Check(c, mistyped).message().find("is I8; weights must be F32, F16 or BF16"), std::string::npos);

  // A tied model's file may keep a copy of the output layer, and rotary
  // tables: passed over.
  const ModelConfig tied = *ModelPreset("qwen2-tiny");
  std::vector<SafetensorsEntry> with_copy = EntriesOf(tied);
  with_copy.push_back(with_copy[0]);
  with_copy.back().name = "lm_head.weight";
  with_copy.push_back(with_copy[1]);
  with_copy.back().name = "model.layers.0.self_attn.rotary_emb.inv_freq";
  EXPECT_TRUE(Check(tied, with_copy).ok()) << Check(tied, with_copy);
}

}  // namespace
}  // namespace ferry
