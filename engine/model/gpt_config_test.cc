#include "engine/model/gpt_config.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(GptConfigTest, Gpt2SmallHasItsPublishedParameterCount) {
  absl::StatusOr<GptConfig> small = GptPreset("gpt2-small");
  ASSERT_TRUE(small.ok());
  // 124,439,808 parameters with the tied output layer.
  EXPECT_EQ(small->ParameterCount(), 124439808);
}

TEST(GptConfigTest, EveryPresetResolvesAndHeadsDivideHidden) {
  for (const std::string& name : GptPresetNames()) {
    absl::StatusOr<GptConfig> c = GptPreset(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->hidden % c->heads, 0) << name;
  }
}

TEST(GptConfigTest, ParameterShapesAddUpToTheCountAndSplitAcrossRanks) {
  for (const std::string& name : GptPresetNames()) {
    const GptConfig c = *GptPreset(name);
    int64_t whole = 0;
    for (const ParameterShape& p : GptParameterShapes(c)) whole += p.numel;
    EXPECT_EQ(whole, c.ParameterCount()) << name;
    ASSERT_EQ(GptParameterShapes(c).size(), static_cast<size_t>(2 + 12 * c.layers + 2)) << name;
    EXPECT_EQ(GptParameterShapes(c).back().stage, c.layers + 1) << name;
  }
  // T = 4 ranks of gpt2-tiny: the split matrices and the embedding rows
  // shrink four times, norms, wpe and row-parallel biases stay whole.
  const GptConfig tiny = *GptPreset("gpt2-tiny");
  const std::vector<ParameterShape> one = GptParameterShapes(tiny, 1), four = GptParameterShapes(tiny, 4);
  ASSERT_EQ(one.size(), four.size());
  for (size_t i = 0; i < one.size(); ++i) {
    const bool split = one[i].name == "wte.weight" || one[i].name.find("c_attn") != std::string::npos ||
                       one[i].name.find("c_fc") != std::string::npos ||
                       one[i].name.find("c_proj.weight") != std::string::npos;
    EXPECT_EQ(four[i].numel * (split ? 4 : 1), one[i].numel) << one[i].name;
  }
}

TEST(GptConfigTest, UnknownPresetNamesTheChoices) {
  absl::StatusOr<GptConfig> c = GptPreset("gpt3");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("gpt2-tiny"), std::string::npos);
}

}  // namespace
}  // namespace ferry
