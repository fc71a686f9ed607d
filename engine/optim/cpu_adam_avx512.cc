// The AVX-512 path of the CPU AdamW kernel: 16 floats at a time. Compiled for
// any x86-64; run only where the CPU supports AVX-512F.

#include <immintrin.h>

#include "engine/optim/cpu_adam.h"
#include "engine/optim/cpu_adam_scalar.h"

namespace ferry {
namespace {

#define FERRY_AVX512 __attribute__((target("avx512f")))

template <LowType kGrad>
FERRY_AVX512 inline __m512 LoadGrad16(const void* grad, int64_t i) {
  if constexpr (kGrad == LowType::kFloat32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else if constexpr (kGrad == LowType::kFloat16) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i)));
  } else {
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
}

template <int kCopy>
FERRY_AVX512 inline void StoreCopy16(void* copy, int64_t i, __m512 p) {
  if constexpr (kCopy == 0) {
    return;
  } else {
    __m256i* out = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(copy) + i);
    if constexpr (kCopy == 1) {
      _mm256_storeu_si256(out, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      const __m512i bits = _mm512_castps_si512(p);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
      const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
      const __mmask16 unordered = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
      rounded = _mm512_mask_blend_epi32(unordered, rounded, nan);
      _mm256_storeu_si256(out, _mm512_cvtepi32_epi16(rounded));
    }
  }
}

template <LowType kGrad, int kCopy>
FERRY_AVX512 void Range(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                        const CpuAdamScalars& s) {
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale);
  const __m512 decay_factor = _mm512_set1_ps(decay ? s.decay_factor : 1.0f);
  const __m512 beta1 = _mm512_set1_ps(s.beta1), one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2), one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 inv_sqrt_bc2 = _mm512_set1_ps(s.inv_sqrt_bias_correction2);
  const __m512 eps = _mm512_set1_ps(s.eps), step_size = _mm512_set1_ps(s.step_size);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_mul_ps(LoadGrad16<kGrad>(b.grad, i), grad_scale);
    __m512 p = _mm512_loadu_ps(b.master + i);
    if (decay) p = _mm512_mul_ps(p, decay_factor);
    const __m512 m = _mm512_fmadd_ps(_mm512_loadu_ps(b.exp_avg + i), beta1, _mm512_mul_ps(g, one_minus_beta1));
    const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(b.exp_avg_sq + i), beta2,
                                     _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_sqrt_bc2, eps);
    p = _mm512_fmadd_ps(step_size, _mm512_div_ps(m, denom), p);
    _mm512_storeu_ps(b.master + i, p);
    _mm512_storeu_ps(b.exp_avg + i, m);
    _mm512_storeu_ps(b.exp_avg_sq + i, v);
    StoreCopy16<kCopy>(b.copy, i, p);
  }
  for (; i < end; ++i) cpu_adam::UpdateOne(b, i, decay, s);
}

template <LowType kGrad>
FERRY_AVX512 void WithCopy(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                           const CpuAdamScalars& s) {
  if (b.copy == nullptr) return Range<kGrad, 0>(b, begin, end, decay, s);
  if (b.copy_type == LowType::kBFloat16) return Range<kGrad, 2>(b, begin, end, decay, s);
  return Range<kGrad, 1>(b, begin, end, decay, s);
}

template <LowType kType>
FERRY_AVX512 double SquaredSum(const void* data, int64_t begin, int64_t end) {
  __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 v = LoadGrad16<kType>(data, i);
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d b =
        _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)));
    low = _mm512_fmadd_pd(a, a, low);
    high = _mm512_fmadd_pd(b, b, high);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(low, high)) + cpu_adam::SquaredSum(data, kType, i, end);
}

}  // namespace

double CpuSquaredNormRangeAvx512(const void* data, LowType type, int64_t begin, int64_t end) {
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

void CpuAdamRangeAvx512(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
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
