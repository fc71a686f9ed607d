#include "engine/model/dropout.h"

#include "engine/common/cpu_generator.h"

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
  at::Generator g = CpuGenerator();
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get<at::CPUGeneratorImpl>()->random64();
}

// Whether element i is kept: each 64-bit hash decides two elements, kept
// when its 32-bit half is at least p * 2^32. The result depends on the seed
// and the element's index only, not on how the work is split.
class KeepRule {
 public:
  KeepRule(double p, uint64_t seed)
      : seed_(seed), threshold_(static_cast<uint32_t>(std::min(p * 4294967296.0, 4294967295.0))) {}

  // Whether element `global` of the whole tensor is kept.
  bool Keep(uint64_t global) const {
    const uint64_t h = Mix(seed_ + (global >> 1) * 0x9E3779B97F4A7C15ull);
    return static_cast<uint32_t>(global & 1 ? h >> 32 : h) >= threshold_;
  }

  // Calls f(i, keep) for i in [2 * pair_begin, 2 * pair_end) ∩ [0, n).
  template <typename F>
  void ForPairs(int64_t pair_begin, int64_t pair_end, int64_t n, F&& f) const {
    for (int64_t i = pair_begin; i < pair_end; ++i) {
      const uint64_t h = Mix(seed_ + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
      f(2 * i, static_cast<uint32_t>(h) >= threshold_);
      if (2 * i + 1 < n) f(2 * i + 1, static_cast<uint32_t>(h >> 32) >= threshold_);
    }
  }

 private:
  uint64_t seed_;
  uint32_t threshold_;
};

constexpr int64_t kGrainPairs = 1 << 14;

// out = keep ? in * scale : 0 over contiguous fp32 tensors, one pass.
void MaskedScale(const at::Tensor& in, const at::Tensor& mask, double scale, at::Tensor& out) {
  const float* x = in.data_ptr<float>();
  const bool* m = mask.data_ptr<bool>();
  float* y = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, in.numel(), kGrainPairs * 2, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = m[i] ? x[i] * s : 0.0f;
  });
}

// The keep mask of a slice of the whole tensor, element by element as the
// whole tensor's mask: each row (all dimensions but the last, which is
// whole) starts at its place in the whole.
at::Tensor SliceMask(const KeepRule& rule, at::IntArrayRef sizes, const DropoutSlice& slice) {
  const int64_t dims = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> whole(sizes.begin(), sizes.end()), offset(sizes.size(), 0);
  for (const DropoutSlice::Dim& d : slice.dims) {
    whole[static_cast<size_t>(d.dim)] = d.whole;
    offset[static_cast<size_t>(d.dim)] = d.offset;
  }
  at::Tensor mask = at::empty(sizes, at::TensorOptions().dtype(at::kBool));
  bool* m = mask.data_ptr<bool>();
  const int64_t inner = dims > 0 ? sizes[static_cast<size_t>(dims - 1)] : 1;
  const int64_t rows = inner > 0 ? mask.numel() / inner : 0;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainPairs / std::max<int64_t>(1, inner)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       // The row's index in the whole, dimension by dimension.
                       int64_t rest = r, global_row = 0, stride = 1;
                       for (int64_t d = dims - 2; d >= 0; --d) {
                         const size_t i = static_cast<size_t>(d);
                         global_row += (rest % sizes[i] + offset[i]) * stride;
                         rest /= sizes[i];
                         stride *= whole[i];
                       }
                       const uint64_t base = static_cast<uint64_t>(global_row * inner);
                       for (int64_t j = 0; j < inner; ++j) m[r * inner + j] = rule.Keep(base + static_cast<uint64_t>(j));
                     }
                   });
  return mask;
}

// x * mask * scale, differentiable in x.
struct MaskedDropout : public torch::autograd::Function<MaskedDropout> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& mask,
                            double scale) {
    ctx->save_for_backward({mask});
    ctx->saved_data["scale"] = scale;
    at::Tensor y = x.mul(mask.to(x.scalar_type()));
    return y.mul_(scale);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    at::Tensor g = grads[0].mul(mask.to(grads[0].scalar_type()));
    g.mul_(ctx->saved_data["scale"].toDouble());
    return {g, at::Tensor(), at::Tensor()};
  }
};

struct CpuDropout : public torch::autograd::Function<CpuDropout> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, double p) {
    const at::Tensor x = input.contiguous();
    const int64_t n = x.numel();
    const KeepRule rule(p, DrawSeed());
    const double scale = 1.0 / (1.0 - p);
    at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kBool));
    at::Tensor y;
    bool* m = mask.data_ptr<bool>();
    if (x.scalar_type() == at::kFloat) {
      // Mask and output in one pass.
      y = at::empty_like(x);
      const float* in = x.data_ptr<float>();
      float* out = y.data_ptr<float>();
      const float s = static_cast<float>(scale);
      at::parallel_for(0, (n + 1) / 2, kGrainPairs, [&](int64_t begin, int64_t end) {
        rule.ForPairs(begin, end, n, [&](int64_t i, bool keep) {
          m[i] = keep;
          out[i] = keep ? in[i] * s : 0.0f;
        });
      });
    } else {
      at::parallel_for(0, (n + 1) / 2, kGrainPairs, [&](int64_t begin, int64_t end) {
        rule.ForPairs(begin, end, n, [&](int64_t i, bool keep) { m[i] = keep; });
      });
      y = x.mul(mask.to(x.scalar_type()));
      y.mul_(scale);
    }
    ctx->save_for_backward({mask});
    ctx->saved_data["scale"] = scale;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor mask = ctx->get_saved_variables()[0];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dx;
    if (g.scalar_type() == at::kFloat) {
      dx = at::empty_like(g);
      MaskedScale(g, mask, scale, dx);
    } else {
      dx = g.mul(mask.to(g.scalar_type()));
      dx.mul_(scale);
    }
    return {dx, at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (!x.device().is_cpu()) return at::dropout(x, p, /*train=*/true);
  return CpuDropout::apply(x, p);
}

at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training, const DropoutSlice& slice) {
  if (slice.dims.empty()) return ApplyDropout(x, p, training);
  if (!training || p == 0.0) return x;
  for (const DropoutSlice::Dim& d : slice.dims) {
    if (d.dim < 0 || d.dim >= x.dim() - 1 || d.offset < 0 || d.offset + x.size(d.dim) > d.whole) {
      throw std::invalid_argument("dropout slice does not fit the tensor");
    }
  }
  // On a GPU the mask is made on the CPU, where the hash is, and moved:
  // slower than the device's own dropout, but the whole tensor's mask.
  const at::Tensor mask = SliceMask(KeepRule(p, DrawSeed()), x.sizes(), slice).to(x.device());
  return MaskedDropout::apply(x, mask, 1.0 / (1.0 - p));
}

DropoutImpl::DropoutImpl(double p) : p_(p) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("dropout probability must be in [0, 1)");
}

}  // namespace ferry
