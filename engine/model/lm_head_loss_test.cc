#include "engine/model/lm_head_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace ferry {
namespace {

struct Result {
  double loss;
  torch::Tensor grad_x, grad_w;
};

// The unsliced head as the model computes it: logits in fp32 from the
// inputs' values, rounded to their type, the loss in fp32.
Result Whole(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& targets) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor w = w0.detach().clone().requires_grad_(true);
  const torch::ScalarType compute = x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  torch::Tensor logits = x.to(compute).matmul(w.to(compute).t()).to(x.scalar_type());
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits.to(compute), targets);
  loss.backward();
  return {loss.item<double>(), x.grad(), w.grad()};
}

Result Sliced(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& targets, int64_t slice) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor w = w0.detach().clone().requires_grad_(true);
  torch::Tensor loss = LmHeadCrossEntropy(x, w, targets, slice);
  loss.backward();
  return {loss.item<double>(), x.grad(), w.grad()};
}

double MaxRelative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max() / b.to(torch::kFloat).abs().max()).item<double>();
}

TEST(LmHeadLossTest, SlicedIsTheWholeHeadInFp32) {
  torch::manual_seed(3);
  // 1000 rows of vocabulary in slices of 128: the last is short; targets in
  // every slice, the last row included.
  torch::Tensor x = torch::randn({37, 24});
  torch::Tensor w = torch::randn({1000, 24}) * 0.5;
  torch::Tensor targets = torch::randint(0, 1000, {37}, torch::kLong);
  targets[0] = 999;
  targets[1] = 0;
  const Result whole = Whole(x, w, targets);
  // The truth, in fp64: neither fp32 computation is exact.
  const Result exact = Whole(x.to(torch::kDouble), w.to(torch::kDouble), targets);
  const double whole_x = MaxRelative(whole.grad_x, exact.grad_x), whole_w = MaxRelative(whole.grad_w, exact.grad_w);
  for (int64_t slice : {128, 1000, 7, 4096}) {
    SCOPED_TRACE(slice);
    const Result sliced = Sliced(x, w, targets, slice);
    EXPECT_NEAR(sliced.loss, whole.loss, 1e-6 * whole.loss);
    // Within 1e-6 of the fp64 gradients where the whole head is, and within
    // 2e-6 of the whole head's own (each carries fp32's rounding).
    EXPECT_LT(MaxRelative(sliced.grad_x, exact.grad_x), std::max(1e-6, 1.5 * whole_x));
    EXPECT_LT(MaxRelative(sliced.grad_w, exact.grad_w), std::max(1e-6, 1.5 * whole_w));
    EXPECT_LT(MaxRelative(sliced.grad_x, whole.grad_x), 2e-6);
    EXPECT_LT(MaxRelative(sliced.grad_w, whole.grad_w), 2e-6);
  }
}

TEST(LmHeadLossTest, ReducedPrecisionRoundsAsTheWholeHeadDoes) {
  torch::manual_seed(4);
  torch::Tensor x = torch::randn({64, 32}).to(torch::kBFloat16);
  torch::Tensor w = (torch::randn({500, 32}) * 0.3).to(torch::kBFloat16);
  torch::Tensor targets = torch::randint(0, 500, {64}, torch::kLong);
  const Result whole = Whole(x, w, targets);
  const Result sliced = Sliced(x, w, targets, 64);
  EXPECT_EQ(sliced.grad_x.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(sliced.grad_w.scalar_type(), torch::kBFloat16);
  EXPECT_NEAR(sliced.loss, whole.loss, 1e-6 * whole.loss);
  // The gradients are bf16 values (8 bits of mantissa), summed in another
  // order: within a few units of their last place.
  EXPECT_LT(MaxRelative(sliced.grad_x, whole.grad_x), 2e-2);
  EXPECT_LT(MaxRelative(sliced.grad_w, whole.grad_w), 2e-2);
}

TEST(LmHeadLossTest, NativeReducedProductsStayWithinBf16RoundingOfTheFp32Ones) {
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({64, 32}).to(torch::kBFloat16);
  torch::Tensor w = (torch::randn({500, 32}) * 0.3).to(torch::kBFloat16);
  torch::Tensor targets = torch::randint(0, 500, {64}, torch::kLong);
  const Result fp32 = Sliced(x, w, targets, 64);
  torch::Tensor xn = x.detach().clone().requires_grad_(true);
  torch::Tensor wn = w.detach().clone().requires_grad_(true);
  torch::Tensor loss = LmHeadCrossEntropy(xn, wn, targets, 64, /*native=*/true);
  loss.backward();
  EXPECT_EQ(xn.grad().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(wn.grad().scalar_type(), torch::kBFloat16);
  // Both round each logit to bf16 once; they differ by the order of the
  // products' sums (and, natively, a bf16 rounding of each slice's
  // gradient of x before the slices are summed).
  EXPECT_NEAR(loss.item<double>(), fp32.loss, 1e-3 * fp32.loss);
  EXPECT_LT(MaxRelative(xn.grad(), fp32.grad_x), 2e-2);
  EXPECT_LT(MaxRelative(wn.grad(), fp32.grad_w), 2e-2);
  // In fp32 there is nothing to compute natively: the same numbers.
  torch::Tensor xf = torch::randn({16, 8});
  torch::Tensor wf = torch::randn({40, 8});
  torch::Tensor tf = torch::randint(0, 40, {16}, torch::kLong);
  EXPECT_EQ(LmHeadCrossEntropy(xf, wf, tf, 16, true).item<double>(),
            LmHeadCrossEntropy(xf, wf, tf, 16, false).item<double>());
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(LmHeadLossTest, AnExistingGradientIsAddedToInPlace) {
  torch::manual_seed(6);
  torch::Tensor x = torch::randn({20, 16});
  torch::Tensor w0 = torch::randn({300, 16});
  torch::Tensor targets = torch::randint(0, 300, {20}, torch::kLong);
  const Result whole = Whole(x, w0, targets);
  torch::Tensor w = w0.clone().requires_grad_(true);
  torch::Tensor buffer = torch::full({300, 16}, 0.5);
  w.mutable_grad() = buffer;
  LmHeadCrossEntropy(x, w, targets, 64).backward();
  EXPECT_EQ(w.grad().data_ptr(), buffer.data_ptr()) << "the same memory, added to";
  EXPECT_LT(MaxRelative(w.grad() - 0.5, whole.grad_w), 2e-6);
}

}  // namespace
}  // namespace ferry
