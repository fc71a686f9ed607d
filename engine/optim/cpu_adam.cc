#include "engine/optim/cpu_adam.h"

#include <ATen/Parallel.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/optim/cpu_adam_scalar.h"

namespace ferry {

const char* SimdPathName(SimdPath path) {
  switch (path) {
    case SimdPath::kPortable:
      return "portable";
    case SimdPath::kAvx2:
      return "avx2";
    case SimdPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

#if defined(__x86_64__)
// From CPUID: clang's __builtin_cpu_supports does not know "f16c".
bool CpuHasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

bool SimdPathSupported(SimdPath path) {
  switch (path) {
    case SimdPath::kPortable:
      return true;
    case SimdPath::kAvx2:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
#else
      return false;
#endif
    case SimdPath::kAvx512:
#if defined(__x86_64__)
      return __builtin_cpu_supports("avx512f");
#else
      return false;
#endif
  }
  return false;
}

SimdPath BestSimdPath() {
  if (SimdPathSupported(SimdPath::kAvx512)) return SimdPath::kAvx512;
  if (SimdPathSupported(SimdPath::kAvx2)) return SimdPath::kAvx2;
  return SimdPath::kPortable;
}

void CpuAdamRangePortable(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                          const CpuAdamScalars& s) {
  for (int64_t i = begin; i < end; ++i) cpu_adam::UpdateOne(b, i, decay, s);
}

double CpuSquaredNormRangePortable(const void* data, LowType type, int64_t begin, int64_t end) {
  return cpu_adam::SquaredSum(data, type, begin, end);
}

double CpuSquaredNorm(const void* data, LowType type, int64_t numel, SimdPath path) {
  if (numel <= 0) return 0;
  auto kernel = path == SimdPath::kAvx512 ? &CpuSquaredNormRangeAvx512
                : path == SimdPath::kAvx2 ? &CpuSquaredNormRangeAvx2
                                          : &CpuSquaredNormRangePortable;
  constexpr int64_t kBlock = 1 << 14;
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
  std::vector<double> sums(static_cast<size_t>(blocks));
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      sums[static_cast<size_t>(k)] = kernel(data, type, k * kBlock, std::min(numel, (k + 1) * kBlock));
    }
  });
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

void CpuAdamWStep(const CpuAdamBuffers& buffers, const std::vector<DecaySegment>& decay,
                  const AdamWHyper& h, SimdPath path) {
  if (buffers.numel <= 0) return;
  CpuAdamScalars s;
  s.grad_scale = static_cast<float>(h.grad_scale);
  s.decay_factor = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, double(h.step));
  s.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  s.eps = static_cast<float>(h.eps);
  s.step_size = static_cast<float>(-h.lr / bias_correction1);

  auto kernel = path == SimdPath::kAvx512 ? &CpuAdamRangeAvx512
                : path == SimdPath::kAvx2 ? &CpuAdamRangeAvx2
                                          : &CpuAdamRangePortable;
  // The buffer as runs that are all decayed or all not.
  struct Run {
    int64_t begin, end;
    bool decay;
  };
  std::vector<DecaySegment> sorted = decay;
  std::sort(sorted.begin(), sorted.end(),
            [](const DecaySegment& a, const DecaySegment& b) { return a.offset < b.offset; });
  std::vector<Run> runs;
  int64_t at = 0;
  const bool decays = h.weight_decay != 0.0;
  for (const DecaySegment& d : sorted) {
    const int64_t begin = std::clamp<int64_t>(d.offset, 0, buffers.numel);
    const int64_t end = std::clamp<int64_t>(d.offset + d.numel, 0, buffers.numel);
    if (begin > at) runs.push_back({at, begin, false});
    if (end > begin) runs.push_back({begin, end, decays});
    at = std::max(at, end);
  }
  if (at < buffers.numel) runs.push_back({at, buffers.numel, false});

  // Blocks of 16K elements (a multiple of every vector width) across threads.
  constexpr int64_t kBlock = 1 << 14;
  at::parallel_for(0, (buffers.numel + kBlock - 1) / kBlock, 1, [&](int64_t first, int64_t last) {
    const int64_t lo = first * kBlock;
    const int64_t hi = std::min(buffers.numel, last * kBlock);
    for (const Run& r : runs) {
      const int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
      if (b < e) kernel(buffers, b, e, r.decay, s);
    }
  });
}

}  // namespace ferry
