#pragma once

// The one-element AdamW update every path shares (tails of vector loops use
// it), and fp16/bf16 conversions. Internal to engine/optim.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/optim/cpu_adam.h"

namespace ferry {
namespace cpu_adam {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, with overflow to infinity and NaN kept NaN.
inline uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000;
  const uint32_t abs = bits & 0x7fffffff;
  if (abs >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds past the largest half
  if (abs < 0x38800000) {  // subnormal or zero in half
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs - 0x38000000) >> 13);
  const uint32_t remainder = abs & 0x1fff;
  if (remainder > 0x1000 || (remainder == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline float LoadValue(const void* data, LowType type, int64_t i) {
  switch (type) {
    case LowType::kFloat32:
      return static_cast<const float*>(data)[i];
    case LowType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case LowType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
  }
  return 0;
}

inline float LoadGrad(const CpuAdamBuffers& b, int64_t i) { return LoadValue(b.grad, b.grad_type, i); }

// The squares of [begin, end) summed in fp64, one value at a time.
inline double SquaredSum(const void* data, LowType type, int64_t begin, int64_t end) {
  double sum = 0;
  for (int64_t i = begin; i < end; ++i) {
    const double v = LoadValue(data, type, i);
    sum += v * v;
  }
  return sum;
}

inline void StoreCopy(const CpuAdamBuffers& b, int64_t i, float p) {
  uint16_t* out = static_cast<uint16_t*>(b.copy);
  out[i] = b.copy_type == LowType::kBFloat16 ? FloatToBFloat16(p) : FloatToHalf(p);
}

inline void UpdateOne(const CpuAdamBuffers& b, int64_t i, bool decay, const CpuAdamScalars& s) {
  const float g = LoadGrad(b, i) * s.grad_scale;
  float p = b.master[i];
  if (decay) p *= s.decay_factor;
  const float m = b.exp_avg[i] * s.beta1 + g * s.one_minus_beta1;
  const float v = b.exp_avg_sq[i] * s.beta2 + s.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) * s.inv_sqrt_bias_correction2 + s.eps;
  p += s.step_size * (m / denom);
  b.master[i] = p;
  b.exp_avg[i] = m;
  b.exp_avg_sq[i] = v;
  if (b.copy != nullptr) StoreCopy(b, i, p);
}

}  // namespace cpu_adam
}  // namespace ferry
