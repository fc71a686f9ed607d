#include "engine/model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace ferry {
namespace {

// splitmix64's finaliser: consecutive counters give independent-looking
// 64-bit values.
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t DrawSeed() {
  at::Generator g = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get<at::CPUGeneratorImpl>()->random64();
}

// True where an element is kept: each 64-bit hash decides two elements,
// kept when its 32-bit half is at least p * 2^32. The result depends on the
// seed and the element's index only, not on how the work is split.
at::Tensor KeepMask(at::IntArrayRef sizes, double p, uint64_t seed) {
  at::Tensor mask = at::empty(sizes, at::TensorOptions().dtype(at::kBool));
  bool* m = mask.data_ptr<bool>();
  const int64_t n = mask.numel();
  const uint32_t threshold = static_cast<uint32_t>(std::min(p * 4294967296.0, 4294967295.0));
  at::parallel_for(0, (n + 1) / 2, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t h = Mix(seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
      m[2 * i] = static_cast<uint32_t>(h) >= threshold;
      if (2 * i + 1 < n) m[2 * i + 1] = static_cast<uint32_t>(h >> 32) >= threshold;
    }
  });
  return mask;
}

struct CpuDropout : public torch::autograd::Function<CpuDropout> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double p) {
    const at::Tensor mask = KeepMask(x.sizes(), p, DrawSeed());
    const double scale = 1.0 / (1.0 - p);
    ctx->save_for_backward({mask});
    ctx->saved_data["scale"] = scale;
    at::Tensor y = x.mul(mask);
    return y.mul_(scale);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    at::Tensor g = grads[0].mul(mask);
    g.mul_(ctx->saved_data["scale"].toDouble());
    return {g, at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (!x.device().is_cpu()) return at::dropout(x, p, /*train=*/true);
  return CpuDropout::apply(x, p);
}

DropoutImpl::DropoutImpl(double p) : p_(p) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("dropout probability must be in [0, 1)");
}

}  // namespace ferry
