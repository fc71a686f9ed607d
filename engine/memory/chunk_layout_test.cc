#include "engine/memory/chunk_layout.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "engine/memory/tensor_state.h"

namespace ferry {
namespace {

TEST(ChunkLayoutTest, PacksInOrderWithoutSpanningChunksOrGroups) {
  absl::StatusOr<ChunkLayout> layout = PackTensors({4, 1, 3, 2, 5, 1}, {0, 0, 0, 1, 1, 1}, 6);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->chunk_count(), 4);
  // Group 0: [4, 1] then [3] (3 more would exceed 6); group 1: [2] then [5, 1].
  EXPECT_EQ(layout->slots[1].chunk, 0);
  EXPECT_EQ(layout->slots[1].offset, 4);
  EXPECT_EQ(layout->slots[2].chunk, 1);
  EXPECT_EQ(layout->slots[3].chunk, 2) << "a new group starts a new chunk";
  EXPECT_EQ(layout->slots[4].chunk, 3);
  EXPECT_EQ(layout->slots[5].offset, 5);
  EXPECT_EQ(layout->capacity, (std::vector<int64_t>{5, 3, 2, 6})) << "chunks are cut to size";
  EXPECT_EQ(layout->wasted_elements(), 0);
}

TEST(ChunkLayoutTest, OversizedTensorsGetChunksOfTheirOwn) {
  absl::StatusOr<ChunkLayout> layout = PackTensors({2, 10, 3}, {}, 4);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->chunk_count(), 3);
  EXPECT_EQ(layout->capacity[1], 10);
  EXPECT_EQ(layout->slots[2].chunk, 2) << "nothing shares the dedicated chunk";
}

// A GPT's tensors in first-use order, grouped by stage: embeddings, then per
// block ln_1 (2), attn qkv (w, b), attn proj (w, b), ln_2 (2), mlp fc (w, b),
// mlp proj (w, b), then the final norm.
void Gpt(int64_t h, int64_t vocab, int64_t seq, int layers, std::vector<int64_t>* numels,
         std::vector<int>* groups) {
  *numels = {vocab * h, seq * h};
  *groups = {0, 0};
  for (int l = 0; l < layers; ++l) {
    for (int64_t n : {h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h}) {
      numels->push_back(n);
      groups->push_back(1 + l);
    }
  }
  numels->push_back(h);
  numels->push_back(h);
  groups->push_back(1 + layers);
  groups->push_back(1 + layers);
}

TEST(ChunkLayoutTest, SearchFindsTheSmallestSizeWithinTheChunkBudget) {
  std::vector<int64_t> numels;
  std::vector<int> groups;
  Gpt(64, 512, 32, 6, &numels, &groups);
  ChunkSearchOptions options;
  options.step_elements = 64;
  options.max_chunks = 20;
  absl::StatusOr<ChunkLayout> layout = SearchChunkLayout(numels, groups, options);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->waste_fraction(), 0.0);
  EXPECT_LE(layout->chunk_count(), 20);
  // One step smaller would need more chunks.
  absl::StatusOr<ChunkLayout> smaller = PackTensors(numels, groups, layout->chunk_elements - 64);
  ASSERT_TRUE(smaller.ok());
  EXPECT_GT(smaller->chunk_count(), 20);
  // Every block's tensors sit in chunks of their own block.
  for (size_t i = 1; i < numels.size(); ++i) {
    if (groups[i] != groups[i - 1]) {
      EXPECT_NE(layout->slots[i].chunk, layout->slots[i - 1].chunk) << i;
    }
  }
}

TEST(ChunkLayoutTest, BadInput) {
  EXPECT_FALSE(PackTensors({1}, {}, 0).ok());
  EXPECT_FALSE(PackTensors({0}, {}, 4).ok());
  EXPECT_FALSE(PackTensors({1, 2}, {0}, 4).ok());
  EXPECT_FALSE(SearchChunkLayout({}, {}).ok());
}

TEST(TensorStateTest, TheStepCycleIsLegal) {
  TensorState s = TensorState::kFree;
  s = Transition("w", s, TensorState::kHold);
  s = Transition("w", s, TensorState::kCompute);             // forward
  s = Transition("w", s, TensorState::kHold);
  s = Transition("w", s, TensorState::kCompute);             // backward, tied: more to come
  s = Transition("w", s, TensorState::kHoldAfterBackward);
  s = Transition("w", s, TensorState::kCompute);             // last backward use
  s = Transition("w", s, TensorState::kReadyForReduce);
  s = Transition("w", s, TensorState::kHold);                // optimizer done
  EXPECT_EQ(s, TensorState::kHold);
}

TEST(TensorStateTest, IllegalTransitionsFailLoudly) {
  EXPECT_THROW(Transition("w", TensorState::kHold, TensorState::kReadyForReduce), std::logic_error);
  EXPECT_THROW(Transition("w", TensorState::kFree, TensorState::kCompute), std::logic_error);
  EXPECT_THROW(Transition("w", TensorState::kReadyForReduce, TensorState::kCompute), std::logic_error);
  EXPECT_THROW(Transition("w", TensorState::kHoldAfterBackward, TensorState::kHold), std::logic_error);
  try {
    Transition("h.3.mlp.c_fc.weight", TensorState::kCompute, TensorState::kFree);
    FAIL();
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "illegal tensor state transition for h.3.mlp.c_fc.weight: compute -> free");
  }
}

}  // namespace
}  // namespace ferry
