#include "engine/optim/flat_adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace ferry {
namespace {

// Two parameters (a decayed matrix, an undecayed bias) stepped by
// torch::optim::AdamW and by FlatAdamWStep over one flat buffer.
TEST(FlatAdamWTest, MatchesTorchAdamWElementForElement) {
  torch::manual_seed(0);
  torch::Tensor w = torch::randn({7, 5}), b = torch::randn({5});
  torch::Tensor tw = w.clone().requires_grad_(), tb = b.clone().requires_grad_();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto decayed = std::make_unique<torch::optim::AdamWOptions>(0.01);
  decayed->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  auto plain = std::make_unique<torch::optim::AdamWOptions>(0.01);
  plain->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0);
  groups.emplace_back(std::vector<torch::Tensor>{tw}, std::move(decayed));
  groups.emplace_back(std::vector<torch::Tensor>{tb}, std::move(plain));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(0.01));

  torch::Tensor flat = torch::cat({w.flatten(), b});
  torch::Tensor m = torch::zeros_like(flat), v = torch::zeros_like(flat);
  for (int64_t step = 1; step <= 20; ++step) {
    torch::Tensor gw = torch::randn({7, 5}), gb = torch::randn({5});
    tw.mutable_grad() = gw.clone();
    tb.mutable_grad() = gb.clone();
    reference.step();
    torch::Tensor g = torch::cat({gw.flatten(), gb});
    AdamWHyper h;
    h.lr = 0.01;
    h.beta1 = 0.9;
    h.beta2 = 0.95;
    h.weight_decay = 0.1;
    h.step = step;
    FlatAdamWStep(flat, g, m, v, {{0, 35}}, h);
  }
  EXPECT_TRUE(torch::equal(flat.narrow(0, 0, 35), tw.detach().flatten()))
      << (flat.narrow(0, 0, 35) - tw.detach().flatten()).abs().max();
  EXPECT_TRUE(torch::equal(flat.narrow(0, 35, 5), tb.detach()));
}

TEST(FlatAdamWTest, GradScaleClipsFirst) {
  torch::Tensor p = torch::ones({4}), g = torch::full({4}, 2.0), m = torch::zeros({4}),
                v = torch::zeros({4});
  AdamWHyper h;
  h.grad_scale = 0.5;
  FlatAdamWStep(p, g, m, v, {}, h);
  EXPECT_TRUE(torch::allclose(g, torch::ones({4})));
  EXPECT_TRUE(torch::allclose(m, torch::full({4}, 0.1)));
}

}  // namespace
}  // namespace ferry
