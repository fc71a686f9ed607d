#include "engine/model/dropout.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace ferry {
namespace {

TEST(DropoutTest, KeepsAboutOneMinusPAndScalesWhatItKeeps) {
  torch::manual_seed(3);
  const double p = 0.1;
  torch::Tensor x = torch::ones({64, 1000});
  torch::Tensor y = ApplyDropout(x, p, /*training=*/true);
  const double kept = y.ne(0).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(kept, 1 - p, 0.01);  // 64,000 draws: 3 standard deviations is 0.0035
  EXPECT_TRUE(torch::allclose(y.masked_select(y.ne(0)), torch::full({1}, 1 / (1 - p))));
  // Rows are not copies of each other.
  EXPECT_FALSE(torch::equal(y[0], y[1]));
}

TEST(DropoutTest, OffWhenNotTrainingOrPIsZero) {
  torch::Tensor x = torch::randn({4, 5});
  EXPECT_TRUE(ApplyDropout(x, 0.5, /*training=*/false).is_same(x));
  EXPECT_TRUE(ApplyDropout(x, 0.0, /*training=*/true).is_same(x));
  Dropout module(0.5);
  module->eval();
  EXPECT_TRUE(module->forward(x).is_same(x));
  EXPECT_THROW(Dropout(1.0), std::invalid_argument);
}

TEST(DropoutTest, TheGeneratorsStateReplaysTheMaskWhateverTheThreads) {
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({3, 333, 77});
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor state = generator.get_state();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  torch::Tensor one = ApplyDropout(x, 0.3, true);
  torch::Tensor next = ApplyDropout(x, 0.3, true);
  at::set_num_threads(std::max(2, threads));
  generator.set_state(state);
  torch::Tensor again = ApplyDropout(x, 0.3, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, again));
  EXPECT_FALSE(torch::equal(one, next)) << "each call draws a new mask";
}

// A slice dropped on its own gets the whole tensor's mask: what lets a
// tensor-parallel rank drop its attention heads as the unsharded model would.
TEST(DropoutTest, ASliceGetsTheWholeTensorsMask) {
  torch::manual_seed(9);
  torch::Tensor x = torch::randn({2, 4, 3, 5}) + 3;  // no zeros of its own
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor state = generator.get_state();
  torch::Tensor whole = ApplyDropout(x, 0.4, true);
  for (int64_t offset : {0, 1, 2}) {
    generator.set_state(state);
    torch::Tensor part = x.narrow(1, offset, 2).clone().requires_grad_(true);
    torch::Tensor y = ApplyDropout(part, 0.4, true, DropoutSlice().Along(1, 4, offset));
    EXPECT_TRUE(torch::equal(y, whole.narrow(1, offset, 2))) << offset;
    y.sum().backward();
    EXPECT_TRUE(torch::equal(part.grad().ne(0), y.ne(0)));
  }
  generator.set_state(state);
  EXPECT_TRUE(torch::equal(ApplyDropout(x, 0.4, true, DropoutSlice().Along(0, 2, 0)), whole)) << "the whole as a slice";
  // Two dimensions at once: some rows of the batch and some heads.
  generator.set_state(state);
  torch::Tensor corner = ApplyDropout(x.narrow(0, 1, 1).narrow(1, 2, 2), 0.4, true,
                                      DropoutSlice().Along(0, 2, 1).Along(1, 4, 2));
  EXPECT_TRUE(torch::equal(corner, whole.narrow(0, 1, 1).narrow(1, 2, 2)));
  EXPECT_THROW(ApplyDropout(x, 0.4, true, DropoutSlice().Along(1, 4, 3)), std::invalid_argument);
  EXPECT_THROW(ApplyDropout(x, 0.4, true, DropoutSlice().Along(3, 5, 0)), std::invalid_argument) << "the last dim";
}

TEST(DropoutTest, GradientIsTheMaskTimesTheScale) {
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({8, 9}).requires_grad_(true);
  torch::Tensor y = ApplyDropout(x, 0.25, true);
  torch::Tensor g = torch::randn({8, 9});
  y.backward(g);
  torch::Tensor kept = y.detach().ne(0);
  EXPECT_TRUE(torch::allclose(x.grad(), g * kept / 0.75));
}

}  // namespace
}  // namespace ferry
