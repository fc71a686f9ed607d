#include "engine/optim/cpu_adam.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "engine/optim/cpu_adam_scalar.h"

namespace ferry {
namespace {

std::vector<SimdPath> Paths() {
  std::vector<SimdPath> paths;
  for (SimdPath p : {SimdPath::kPortable, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (SimdPathSupported(p)) paths.push_back(p);
  }
  return paths;
}

// Largest |a - b| relative to the largest |b|.
double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// An odd length (no vector width divides it) with decayed and undecayed runs
// at odd offsets, as a chunk of a weight, a bias and another weight.
constexpr int64_t kN = 100003;
const std::vector<DecaySegment> kDecay = {{0, 60001}, {60017, 39986}};

TEST(CpuAdamTest, MatchesTorchAdamWOver100StepsOnEveryPath) {
  for (SimdPath path : Paths()) {
    SCOPED_TRACE(SimdPathName(path));
    torch::manual_seed(0);
    torch::Tensor init = torch::randn({kN});
    // Reference: three tensors in two groups, as the decay runs say.
    torch::Tensor w1 = init.narrow(0, 0, 60001).clone().requires_grad_();
    torch::Tensor bias = init.narrow(0, 60001, 16).clone().requires_grad_();
    torch::Tensor w2 = init.narrow(0, 60017, 39986).clone().requires_grad_();
    std::vector<torch::optim::OptimizerParamGroup> groups;
    auto decayed = std::make_unique<torch::optim::AdamWOptions>(1e-3);
    decayed->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
    auto plain = std::make_unique<torch::optim::AdamWOptions>(1e-3);
    plain->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0);
    groups.emplace_back(std::vector<torch::Tensor>{w1, w2}, std::move(decayed));
    groups.emplace_back(std::vector<torch::Tensor>{bias}, std::move(plain));
    torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1e-3));

    torch::Tensor master = init.clone(), m = torch::zeros({kN}), v = torch::zeros({kN});
    for (int64_t step = 1; step <= 100; ++step) {
      torch::Tensor g = torch::randn({kN});
      w1.mutable_grad() = g.narrow(0, 0, 60001).clone();
      bias.mutable_grad() = g.narrow(0, 60001, 16).clone();
      w2.mutable_grad() = g.narrow(0, 60017, 39986).clone();
      reference.step();
      CpuAdamBuffers b;
      b.master = master.data_ptr<float>();
      b.grad = g.data_ptr<float>();
      b.exp_avg = m.data_ptr<float>();
      b.exp_avg_sq = v.data_ptr<float>();
      b.numel = kN;
      AdamWHyper h;
      h.lr = 1e-3;
      h.beta1 = 0.9;
      h.beta2 = 0.95;
      h.weight_decay = 0.1;
      h.step = step;
      CpuAdamWStep(b, kDecay, h, path);
    }
    torch::Tensor expected = torch::cat({w1.detach(), bias.detach(), w2.detach()});
    EXPECT_LT(RelativeError(master, expected), 1e-6);
  }
}

TEST(CpuAdamTest, EveryPathAgreesWithThePortableOne) {
  torch::manual_seed(1);
  torch::Tensor init = torch::randn({kN}), grad = torch::randn({kN});
  std::vector<torch::Tensor> results;
  for (SimdPath path : Paths()) {
    torch::Tensor master = init.clone(), m = torch::zeros({kN}), v = torch::zeros({kN});
    CpuAdamBuffers b{master.data_ptr<float>(), grad.data_ptr<float>(), LowType::kFloat32,
                     m.data_ptr<float>(), v.data_ptr<float>(), nullptr, LowType::kFloat16, kN};
    AdamWHyper h;
    h.weight_decay = 0.1;
    h.grad_scale = 0.25;
    for (int step = 1; step <= 10; ++step) {
      h.step = step;
      CpuAdamWStep(b, kDecay, h, path);
    }
    results.push_back(master);
  }
  for (size_t i = 1; i < results.size(); ++i) EXPECT_LT(RelativeError(results[i], results[0]), 1e-6) << i;
}

TEST(CpuAdamTest, SquaredNormOnEveryPathInEveryType) {
  torch::manual_seed(7);
  // Longer than a block (16K), of no vector width's multiple.
  const torch::Tensor values = torch::randn({kN + 40000}) * 3;
  for (auto [dtype, type] : {std::pair{torch::kFloat, LowType::kFloat32}, std::pair{torch::kHalf, LowType::kFloat16},
                             std::pair{torch::kBFloat16, LowType::kBFloat16}}) {
    SCOPED_TRACE(c10::toString(dtype));
    const torch::Tensor t = values.to(dtype);
    const double exact = t.to(torch::kDouble).square().sum().item<double>();
    for (SimdPath path : Paths()) {
      SCOPED_TRACE(SimdPathName(path));
      const double sq = CpuSquaredNorm(t.data_ptr(), type, t.numel(), path);
      EXPECT_NEAR(sq, exact, 1e-12 * exact);
      // The same bits whatever the thread count.
      const int threads = at::get_num_threads();
      at::set_num_threads(1);
      EXPECT_EQ(CpuSquaredNorm(t.data_ptr(), type, t.numel(), path), sq);
      at::set_num_threads(threads);
      // Short ranges and tails.
      EXPECT_NEAR(CpuSquaredNorm(t.data_ptr(), type, 13, path), t.narrow(0, 0, 13).to(torch::kDouble).square().sum().item<double>(), 1e-9);
      EXPECT_EQ(CpuSquaredNorm(t.data_ptr(), type, 0, path), 0.0);
    }
  }
  // An overflow shows.
  torch::Tensor bad = torch::ones({1000}, torch::kBFloat16);
  bad[517] = std::numeric_limits<float>::infinity();
  for (SimdPath path : Paths()) {
    EXPECT_TRUE(std::isinf(CpuSquaredNorm(bad.data_ptr(), LowType::kBFloat16, 1000, path))) << SimdPathName(path);
    bad[517] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(CpuSquaredNorm(bad.data_ptr(), LowType::kBFloat16, 1000, path))) << SimdPathName(path);
    bad[517] = std::numeric_limits<float>::infinity();
  }
}

TEST(CpuAdamTest, ReducedPrecisionGradientsAndCopies) {
  for (SimdPath path : Paths()) {
    for (torch::ScalarType low : {torch::kHalf, torch::kBFloat16}) {
      SCOPED_TRACE(std::string(SimdPathName(path)) + (low == torch::kHalf ? " fp16" : " bf16"));
      torch::manual_seed(2);
      torch::Tensor init = torch::randn({kN});
      torch::Tensor grad_low = (torch::randn({kN}) * 1000).to(low);
      const LowType type = low == torch::kHalf ? LowType::kFloat16 : LowType::kBFloat16;
      // With reduced-precision gradients and a weight copy...
      torch::Tensor master = init.clone(), m = torch::zeros({kN}), v = torch::zeros({kN});
      torch::Tensor copy = torch::empty({kN}, low);
      CpuAdamBuffers b{master.data_ptr<float>(), grad_low.data_ptr(), type, m.data_ptr<float>(),
                       v.data_ptr<float>(), copy.data_ptr(), type, kN};
      // ...against the same step on the gradients widened first.
      torch::Tensor grad32 = grad_low.to(torch::kFloat);
      torch::Tensor master32 = init.clone(), m32 = torch::zeros({kN}), v32 = torch::zeros({kN});
      CpuAdamBuffers b32{master32.data_ptr<float>(), grad32.data_ptr<float>(), LowType::kFloat32,
                         m32.data_ptr<float>(), v32.data_ptr<float>(), nullptr, type, kN};
      AdamWHyper h;
      h.grad_scale = 1.0 / 1024;  // unscaling a loss-scaled gradient
      CpuAdamWStep(b, kDecay, h, path);
      CpuAdamWStep(b32, kDecay, h, path);
      EXPECT_TRUE(torch::equal(master, master32));
      EXPECT_TRUE(torch::equal(m, m32));
      EXPECT_TRUE(torch::equal(copy, master.to(low))) << "the copy is the master rounded to nearest even";
    }
  }
}

TEST(CpuAdamTest, TailsShorterThanAVectorAndEmptyBuffers) {
  for (SimdPath path : Paths()) {
    for (int64_t n : {1, 7, 15, 17, 31, 33}) {
      torch::Tensor p = torch::ones({n}), g = torch::full({n}, 2.0), m = torch::zeros({n}), v = torch::zeros({n});
      CpuAdamBuffers b{p.data_ptr<float>(), g.data_ptr<float>(), LowType::kFloat32, m.data_ptr<float>(),
                       v.data_ptr<float>(), nullptr, LowType::kFloat16, n};
      AdamWHyper h;
      CpuAdamWStep(b, {}, h, path);
      // First step: m = 0.1 g, v = 0.001 g^2, update = lr * sign(g).
      EXPECT_TRUE(torch::allclose(m, torch::full({n}, 0.2))) << n;
      EXPECT_TRUE(torch::allclose(p, torch::full({n}, 1.0 - 1e-3), 1e-6, 1e-7)) << n;
    }
    CpuAdamBuffers empty;
    CpuAdamWStep(empty, {}, AdamWHyper(), path);
  }
}

TEST(CpuAdamTest, HalfAndBFloat16ConversionsMatchLibTorch) {
  // Every half value widens exactly and rounds back to itself.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = cpu_adam::HalfToFloat(static_cast<uint16_t>(h));
    if (f != f) continue;  // NaN payloads need not round-trip
    ASSERT_EQ(cpu_adam::FloatToHalf(f), h) << h;
  }
  torch::manual_seed(3);
  torch::Tensor x = torch::cat({torch::randn({20000}) * 1e-5, torch::randn({20000}) * 3e4,
                                torch::randn({20000}), torch::randn({2000}) * 1e-8});
  torch::Tensor half = x.to(torch::kHalf), bf16 = x.to(torch::kBFloat16);
  const float* xs = x.data_ptr<float>();
  const uint16_t* hs = reinterpret_cast<const uint16_t*>(half.data_ptr());
  const uint16_t* bs = reinterpret_cast<const uint16_t*>(bf16.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(cpu_adam::FloatToHalf(xs[i]), hs[i]) << xs[i];
    ASSERT_EQ(cpu_adam::FloatToBFloat16(xs[i]), bs[i]) << xs[i];
  }
}

TEST(CpuAdamTest, TheBestPathIsSupported) {
  EXPECT_TRUE(SimdPathSupported(BestSimdPath()));
  EXPECT_TRUE(SimdPathSupported(SimdPath::kPortable));
}

}  // namespace
}  // namespace ferry
