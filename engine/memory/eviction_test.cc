#include "engine/memory/eviction.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(EvictionTest, FarthestNextUseGoesFirstAmongEquals) {
  std::vector<EvictionCandidate> c = {
      {1, 100, 3, false}, {2, 100, 9, false}, {3, 100, 5, true}, {4, 100, 9, true}};
  EXPECT_EQ(ChooseVictims(c, 150), (std::vector<int>{4, 3})) << "clean before dirty";
  EXPECT_EQ(ChooseVictims(c, 1), (std::vector<int>{4}));
  EXPECT_EQ(ChooseVictims(c, 0), (std::vector<int>{}));
  EXPECT_EQ(ChooseVictims(c, 10000), (std::vector<int>{4, 3, 2, 1})) << "all, when not enough";
}

TEST(EvictionTest, DeadPayloadsGoBeforeAnythingWorthKeeping) {
  std::vector<EvictionCandidate> c = {{1, 100, 9, false, false}, {2, 100, 2, true, true}};
  EXPECT_EQ(ChooseVictims(c, 50), (std::vector<int>{2}));
}

TEST(EvictionTest, NextUseWrapsToTheNextStep) {
  // A 9-period step; used in forward period 1 and backward period 6.
  EXPECT_EQ(NextUseDistance({1, 6}, 0, 9), 1);
  EXPECT_EQ(NextUseDistance({1, 6}, 1, 9), 5);
  EXPECT_EQ(NextUseDistance({1, 6}, 6, 9), 4) << "next step's period 1";
  EXPECT_EQ(NextUseDistance({}, 3, 9), 18);
}

}  // namespace
}  // namespace ferry
