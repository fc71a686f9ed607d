#include "engine/memory/chunk_layout.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "engine/memory/tensor_state.h"

namespace ferry {
namespace {

TEST(ChunkLayoutTest, PacksInOrderWithoutSpanningChunks) {
  absl::StatusOr<ChunkLayout> layout = PackTensors({4, 3, 2, 5, 1}, 6);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->chunk_count(), 3);
  EXPECT_EQ(layout->slots[0].chunk, 0);
  EXPECT_EQ(layout->slots[1].chunk, 1) << "4 + 3 > 6: the 3 starts a new chunk";
  EXPECT_EQ(layout->slots[2].chunk, 1);
  EXPECT_EQ(layout->slots[2].offset, 3);
  EXPECT_EQ(layout->slots[3].chunk, 2);
  EXPECT_EQ(layout->slots[4].chunk, 2);
  EXPECT_EQ(layout->slots[4].offset, 5);
  EXPECT_EQ(layout->wasted_elements(), 2 + 1 + 0);
}

TEST(ChunkLayoutTest, OversizedTensorsGetChunksOfTheirOwn) {
  absl::StatusOr<ChunkLayout> layout = PackTensors({2, 10, 3}, 4);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->chunk_count(), 3);
  EXPECT_EQ(layout->capacity[1], 10);
  EXPECT_EQ(layout->slots[2].chunk, 2) << "nothing shares the dedicated chunk";
  EXPECT_EQ(layout->wasted_elements(), 2 + 0 + 1);
}

TEST(ChunkLayoutTest, SearchFindsTheBlockSizeOfAGpt) {
  // A GPT's tensors in first-use order: embeddings, then per block
  // ln_1 (2), attn qkv (w, b), attn proj (w, b), ln_2 (2), mlp fc (w, b), mlp proj (w, b).
  const int64_t h = 64, vocab = 512, seq = 32, layers = 6;
  std::vector<int64_t> numels = {vocab * h, seq * h};
  for (int l = 0; l < layers; ++l) {
    for (int64_t n : {h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h}) {
      numels.push_back(n);
    }
  }
  numels.push_back(h);
  numels.push_back(h);
  ChunkSearchOptions options;
  options.step_elements = h;
  options.min_chunks = 4;
  absl::StatusOr<ChunkLayout> layout = SearchChunkLayout(numels, options);
  ASSERT_TRUE(layout.ok());
  EXPECT_GE(layout->chunk_count(), 4);
  EXPECT_LT(layout->waste_fraction(), 0.02) << "chunk of " << layout->chunk_elements;
  // Any other size in the range wastes at least as much.
  for (int64_t size = layout->chunk_elements - 20 * h; size <= layout->chunk_elements + 20 * h;
       size += h) {
    absl::StatusOr<ChunkLayout> other = PackTensors(numels, size);
    if (other.ok() && size >= 4 * h * h && size <= 400000) {
      EXPECT_GE(other->wasted_elements(), layout->wasted_elements()) << size;
    }
  }
}

TEST(ChunkLayoutTest, BadInput) {
  EXPECT_FALSE(PackTensors({1}, 0).ok());
  EXPECT_FALSE(PackTensors({0}, 4).ok());
  EXPECT_FALSE(SearchChunkLayout({}).ok());
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
