// The AVX2 (with FMA and F16C) path of the CPU AdamW kernel: 8 floats at a
// time. Compiled for any x86-64; run only where the CPU supports it.

#include <immintrin.h>

#include "engine/optim/cpu_adam.h"
#include "engine/optim/cpu_adam_scalar.h"

namespace ferry {
namespace {

#define FERRY_AVX2 __attribute__((target("avx2,fma,f16c")))

template <LowType kGrad>
FERRY_AVX2 inline __m256 LoadGrad8(const void* grad, int64_t i) {
  if constexpr (kGrad == LowType::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else if constexpr (kGrad == LowType::kFloat16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i)));
  } else {
    const __m128i raw =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
}

// kCopy: 0 none, 1 fp16, 2 bf16.
template <int kCopy>
FERRY_AVX2 inline void StoreCopy8(void* copy, int64_t i, __m256 p) {
  if constexpr (kCopy == 0) {
    return;
  } else {
    __m128i* out = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(copy) + i);
    if constexpr (kCopy == 1) {
      _mm_storeu_si128(out, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // Round to nearest even; NaN stays NaN (quieted).
      const __m256i bits = _mm256_castps_si256(p);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      __m256i rounded =
          _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
      const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
      const __m256 unordered = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
      rounded = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(unordered));
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0xD8);
      _mm_storeu_si128(out, _mm256_castsi256_si128(packed));
    }
  }
}

template <LowType kGrad, int kCopy>
FERRY_AVX2 void Range(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                      const CpuAdamScalars& s) {
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale);
  const __m256 decay_factor = _mm256_set1_ps(decay ? s.decay_factor : 1.0f);
  const __m256 beta1 = _mm256_set1_ps(s.beta1), one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2), one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(s.inv_sqrt_bias_correction2);
  const __m256 eps = _mm256_set1_ps(s.eps), step_size = _mm256_set1_ps(s.step_size);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(LoadGrad8<kGrad>(b.grad, i), grad_scale);
    __m256 p = _mm256_loadu_ps(b.master + i);
    if (decay) p = _mm256_mul_ps(p, decay_factor);
    const __m256 m = _mm256_fmadd_ps(_mm256_loadu_ps(b.exp_avg + i), beta1, _mm256_mul_ps(g, one_minus_beta1));
    const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(b.exp_avg_sq + i), beta2,
                                     _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_sqrt_bc2, eps);
    p = _mm256_fmadd_ps(step_size, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(b.master + i, p);
    _mm256_storeu_ps(b.exp_avg + i, m);
    _mm256_storeu_ps(b.exp_avg_sq + i, v);
    StoreCopy8<kCopy>(b.copy, i, p);
  }
  for (; i < end; ++i) cpu_adam::UpdateOne(b, i, decay, s);
}

template <LowType kGrad>
FERRY_AVX2 void WithCopy(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                         const CpuAdamScalars& s) {
  if (b.copy == nullptr) return Range<kGrad, 0>(b, begin, end, decay, s);
  if (b.copy_type == LowType::kBFloat16) return Range<kGrad, 2>(b, begin, end, decay, s);
  return Range<kGrad, 1>(b, begin, end, decay, s);
}

template <LowType kType>
FERRY_AVX2 double SquaredSum(const void* data, int64_t begin, int64_t end) {
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 v = LoadGrad8<kType>(data, i);
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    low = _mm256_fmadd_pd(a, a, low);
    high = _mm256_fmadd_pd(b, b, high);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(low, high));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + cpu_adam::SquaredSum(data, kType, i, end);
}

}  // namespace

double CpuSquaredNormRangeAvx2(const void* data, LowType type, int64_t begin, int64_t end) {
  switch (type) {
    case LowType::kFloat32:
      return SquaredSum<LowType::kFloat32>(data, begin, end);
    case LowType::kFloat16:
      return SquaredSum<LowType::kFloat16>(data, begin, end);
    case LowType::kBFloat16:
      return SquaredSum<LowType::kBFloat16>(data, begin, end);
  }
  return 0;
}

void CpuAdamRangeAvx2(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                      const CpuAdamScalars& s) {
  switch (b.grad_type) {
    case LowType::kFloat32:
      return WithCopy<LowType::kFloat32>(b, begin, end, decay, s);
    case LowType::kFloat16:
      return WithCopy<LowType::kFloat16>(b, begin, end, decay, s);
    case LowType::kBFloat16:
      return WithCopy<LowType::kBFloat16>(b, begin, end, decay, s);
  }
}

}  // namespace ferry
