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

// The keep mask of a slice of the whole tensor: `sizes` is the slice's
// shape, which covers [offset, offset + sizes[dim]) of the whole's `whole`
// entries along `dim`. Element by element, as the whole tensor's mask.
at::Tensor SliceMask(const KeepRule& rule, at::IntArrayRef sizes, const DropoutSlice& slice) {
  at::Tensor mask = at::empty(sizes, at::TensorOptions().dtype(at::kBool));
  bool* m = mask.data_ptr<bool>();
  int64_t inner = 1;
  for (int64_t d = slice.dim + 1; d < static_cast<int64_t>(sizes.size()); ++d) inner *= sizes[static_cast<size_t>(d)];
  const int64_t local = sizes[static_cast<size_t>(slice.dim)];
  const int64_t rows = mask.numel() / std::max<int64_t>(1, inner);  // outer x local
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrainPairs / std::max<int64_t>(1, inner)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const int64_t outer = r / local, k = r % local;
                       const uint64_t base =
                           static_cast<uint64_t>((outer * slice.whole + slice.offset + k) * inner);
                       for (int64_t j = 0; j < inner; ++j) m[r * inner + j] = rule.Keep(base + static_cast<uint64_t>(j));
                     }
                   });
  return mask;
}

struct CpuDropout : public torch::autograd::Function<CpuDropout> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, double p,
                            int64_t slice_dim, int64_t slice_whole, int64_t slice_offset) {
    const at::Tensor x = input.contiguous();
    const int64_t n = x.numel();
    const KeepRule rule(p, DrawSeed());
    const double scale = 1.0 / (1.0 - p);
    at::Tensor mask;
    at::Tensor y;
    if (slice_dim >= 0) {
      mask = SliceMask(rule, x.sizes(), {slice_dim, slice_whole, slice_offset});
      y = x.mul(mask.to(x.scalar_type()));
      y.mul_(scale);
      ctx->save_for_backward({mask});
      ctx->saved_data["scale"] = scale;
      return y;
    }
    mask = at::empty(x.sizes(), x.options().dtype(at::kBool));
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
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training) {
  if (!training || p == 0.0) return x;
  if (!x.device().is_cpu()) return at::dropout(x, p, /*train=*/true);
  return CpuDropout::apply(x, p, -1, 0, 0);
}

at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training, const DropoutSlice& slice) {
  if (!training || p == 0.0) return x;
  if (slice.dim < 0 || slice.dim >= x.dim() || slice.offset < 0 || slice.offset + x.size(slice.dim) > slice.whole) {
    throw std::invalid_argument("dropout slice does not fit the tensor");
  }
  if (!x.device().is_cpu()) {
    // The mask is made on the CPU, where the hash is, and moved: slower than
    // the device's own dropout, but the same mask as the whole tensor's.
    const at::Tensor mask = SliceMask(KeepRule(p, DrawSeed()), x.sizes(), slice).to(x.device());
    return x * mask.to(x.scalar_type()) * (1.0 / (1.0 - p));
  }
  return CpuDropout::apply(x, p, slice.dim, slice.whole, slice.offset);
}

DropoutImpl::DropoutImpl(double p) : p_(p) {
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("dropout probability must be in [0, 1)");
}

}  // namespace ferry
