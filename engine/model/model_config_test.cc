#include "engine/model/model_config.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(ModelConfigTest, Gpt2SmallHasItsPublishedParameterCount) {
  absl::StatusOr<ModelConfig> small = ModelPreset("gpt2-small");
  ASSERT_TRUE(small.ok());
  // 124,439,808 parameters with the tied output layer.
  EXPECT_EQ(small->ParameterCount(), 124439808);
}

// The parameter counts the model cards and Hugging Face publish, derived
// here from the shapes alone.
TEST(ModelConfigTest, LlamaFamilyPresetsHaveTheirPublishedParameterCounts) {
  const std::vector<std::pair<std::string, int64_t>> published = {
      {"llama-3.2-1b", 1235814400},   {"llama-3.2-3b", 3212749824}, {"llama-3.1-8b", 8030261248},
      {"tinyllama-1.1b", 1100048384}, {"mistral-7b", 7241732096},   {"qwen2.5-0.5b", 494032768},
      {"qwen2.5-1.5b", 1543714304},   {"qwen2.5-7b", 7615616512},   {"qwen3-0.6b", 596049920},
      {"qwen3-1.7b", 1720574976},
  };
  for (const auto& [name, count] : published) {
    absl::StatusOr<ModelConfig> c = ModelPreset(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->ParameterCount(), count) << name;
  }
}

TEST(ModelConfigTest, EveryPresetResolvesAndHoldsTogether) {
  for (const std::string& name : ModelPresetNames()) {
    absl::StatusOr<ModelConfig> c = ModelPreset(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(CheckModelConfig(*c).ok()) << name << ": " << CheckModelConfig(*c);
    EXPECT_EQ(c->heads % c->KvHeads(), 0) << name;
    EXPECT_LE(c->seq_len, c->MaxPositions()) << name;
  }
  // Qwen3's heads are wider than hidden / heads.
  const ModelConfig qwen3 = *ModelPreset("qwen3-0.6b");
  EXPECT_EQ(qwen3.QkvRows(), (16 + 2 * 8) * 128);
  EXPECT_NE(qwen3.heads * qwen3.HeadDim(), qwen3.hidden);
}

TEST(ModelConfigTest, TensorParallelismSplitsWholeKeyValueHeadsOrIsRefused) {
  const ModelConfig llama = *ModelPreset("llama-3.2-1b");  // 32 heads, 8 key/value heads
  EXPECT_TRUE(CheckModelConfig(llama, 8).ok());
  const absl::Status sixteen = CheckModelConfig(llama, 16);
  EXPECT_EQ(sixteen.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sixteen.message().find("model.kv_heads (8)"), std::string::npos) << sixteen;
  // Qwen2.5-0.5B's 14 heads and 2 key/value heads split only in two.
  const ModelConfig qwen = *ModelPreset("qwen2.5-0.5b");
  EXPECT_TRUE(CheckModelConfig(qwen, 2).ok());
  EXPECT_FALSE(CheckModelConfig(qwen, 4).ok());

  // The fused q/k/v rows split each segment: query heads, key heads, value
  // heads; SwiGLU's [gate; up] the same.
  const TensorSplit qkv = TensorParallelSplit(llama, "h.3.attn.c_attn.weight");
  EXPECT_EQ(qkv.dim, 0);
  EXPECT_EQ(qkv.segments, (std::vector<int64_t>{2048, 512, 512}));
  const TensorSplit gate_up = TensorParallelSplit(llama, "h.0.mlp.c_fc.weight");
  EXPECT_EQ(gate_up.segments, (std::vector<int64_t>{8192, 8192}));
  EXPECT_EQ(TensorParallelSplit(llama, "h.0.mlp.c_proj.weight").dim, 1);
  EXPECT_EQ(TensorParallelSplit(llama, "h.0.ln_1.weight").dim, -1);
  EXPECT_EQ(TensorParallelSplit(*ModelPreset("llama-3.1-8b"), "lm_head.weight").dim, 0);
}

TEST(ModelConfigTest, LlamaShapesAddUpAndSplitAcrossRanks) {
  for (const char* name : {"llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "llama-3.1-8b"}) {
    const ModelConfig c = *ModelPreset(name);
    int64_t whole = 0, halves = 0;
    for (const ParameterShape& p : ModelParameterShapes(c)) whole += p.numel;
    for (const ParameterShape& p : ModelParameterShapes(c, 2)) {
      halves += p.numel * (TensorParallelSplit(c, p.name).dim >= 0 ? 2 : 1);
    }
    EXPECT_EQ(whole, c.ParameterCount()) << name;
    EXPECT_EQ(halves, whole) << name;
    const std::vector<ParameterShape> shapes = ModelParameterShapes(c);
    const ModelStages stages = StagesOf(c);
    EXPECT_EQ(stages.pieces, name == std::string("llama-3.1-8b") ? 8 : 1) << name;
    EXPECT_EQ(shapes.back().name,
              c.tied ? "ln_f.weight" : VocabPieceName("lm_head.weight", stages.pieces, stages.pieces - 1))
        << name;
    EXPECT_EQ(shapes.back().stage, stages.count() - 1) << name;
    for (const ParameterShape& p : shapes) {
      EXPECT_EQ(p.name.find("wpe"), std::string::npos) << name << ": rotary positions have no table";
      EXPECT_EQ(p.name.find("ln_1.bias"), std::string::npos) << name << ": RMSNorm has no bias";
    }
  }
}

TEST(ModelConfigTest, InconsistentConfigurationsNameTheField) {
  ModelConfig c = *ModelPreset("llama-tiny");
  c.kv_heads = 3;
  EXPECT_NE(CheckModelConfig(c).message().find("model.kv_heads"), std::string::npos);
  c = *ModelPreset("llama-tiny");
  c.seq_len = c.max_positions + 1;
  EXPECT_NE(CheckModelConfig(c).message().find("model.seq_len"), std::string::npos);
  c = *ModelPreset("llama-tiny");
  c.head_dim = 31;
  EXPECT_NE(CheckModelConfig(c).message().find("model.head_dim"), std::string::npos);
}

TEST(ModelConfigTest, ParameterShapesAddUpToTheCountAndSplitAcrossRanks) {
  for (const std::string& name : ModelPresetNames()) {
    const ModelConfig c = *ModelPreset(name);
    if (c.model_type != "gpt2") continue;
    int64_t whole = 0;
    for (const ParameterShape& p : ModelParameterShapes(c)) whole += p.numel;
    EXPECT_EQ(whole, c.ParameterCount()) << name;
    // gpt2-xl's 80 M-element embedding is kept in two pieces (VocabPieces).
    const int pieces = StagesOf(c).pieces;
    EXPECT_EQ(pieces, name == "gpt2-xl" ? 2 : 1) << name;
    ASSERT_EQ(ModelParameterShapes(c).size(), static_cast<size_t>(pieces + 1 + 12 * c.layers + 2)) << name;
    EXPECT_EQ(ModelParameterShapes(c).back().stage, StagesOf(c).head()) << name;
  }
  // T = 4 ranks of gpt2-tiny: the split matrices and the embedding rows
  // shrink four times, norms, wpe and row-parallel biases stay whole.
  const ModelConfig tiny = *ModelPreset("gpt2-tiny");
  const std::vector<ParameterShape> one = ModelParameterShapes(tiny, 1), four = ModelParameterShapes(tiny, 4);
  ASSERT_EQ(one.size(), four.size());
  for (size_t i = 0; i < one.size(); ++i) {
    const bool split = one[i].name == "wte.weight" || one[i].name.find("c_attn") != std::string::npos ||
                       one[i].name.find("c_fc") != std::string::npos ||
                       one[i].name.find("c_proj.weight") != std::string::npos;
    EXPECT_EQ(four[i].numel * (split ? 4 : 1), one[i].numel) << one[i].name;
  }
}

TEST(ModelConfigTest, UnknownPresetNamesTheChoices) {
  absl::StatusOr<ModelConfig> c = ModelPreset("gpt3");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("gpt2-tiny"), std::string::npos);
}

}  // namespace
}  // namespace ferry
