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

TEST(GptConfigTest, UnknownPresetNamesTheChoices) {
  absl::StatusOr<GptConfig> c = GptPreset("gpt3");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("gpt2-tiny"), std::string::npos);
}

}  // namespace
}  // namespace ferry
