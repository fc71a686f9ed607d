#pragma once

// AdamW for chunks whose optimizer states live on the host: one fused,
// vectorised, multi-threaded pass over flat buffers that unscales the
// gradient (fp32, fp16 or bf16), applies weight decay, updates both moments
// and the fp32 master weight, and writes the reduced-precision copy of the
// weight if there is one. Same arithmetic as PyTorch's AdamW (results agree
// to float rounding: the fused pass multiplies by reciprocals and contracts
// into fused multiply-adds where PyTorch's separate kernels do not).

#include <cstdint>
#include <vector>

#include "engine/optim/flat_adamw.h"

namespace ferry {

enum class SimdPath { kPortable, kAvx2, kAvx512 };

const char* SimdPathName(SimdPath path);
// Whether this CPU can run `path`.
bool SimdPathSupported(SimdPath path);
// The widest path this CPU supports.
SimdPath BestSimdPath();

// Element types of the gradient and of the reduced-precision weight copy.
enum class LowType { kFloat32, kFloat16, kBFloat16 };

struct CpuAdamBuffers {
  // fp32 master weights, updated in place.
  float* master = nullptr;
  // Gradients, of `grad_type`.
  const void* grad = nullptr;
  LowType grad_type = LowType::kFloat32;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // If set, receives the updated weights as `copy_type` (fp16 or bf16,
  // rounded to nearest even).
  void* copy = nullptr;
  LowType copy_type = LowType::kFloat16;
  int64_t numel = 0;
};

// One AdamW step over `numel` elements. Weight decay applies within `decay`
// (offsets in elements) only. Splits the work across LibTorch's intra-op
// threads; `path` must be supported (see SimdPathSupported).
void CpuAdamWStep(const CpuAdamBuffers& buffers, const std::vector<DecaySegment>& decay,
                  const AdamWHyper& hyper, SimdPath path);

// The sum of the squares of the `numel` values of `type` at `data` (the
// squared L2 norm of a chunk's gradients), accumulated in fp64 in an order
// that depends on neither the thread count nor the path's width across
// blocks: blocks of 16K elements, each summed on its own, their sums added
// in order. inf or NaN where any value is. One pass over the values, no
// widened copy; split across LibTorch's intra-op threads.
double CpuSquaredNorm(const void* data, LowType type, int64_t numel, SimdPath path);

// Per-path sums of squares over [begin, end). For the dispatcher and tests.
double CpuSquaredNormRangePortable(const void* data, LowType type, int64_t begin, int64_t end);
double CpuSquaredNormRangeAvx2(const void* data, LowType type, int64_t begin, int64_t end);
double CpuSquaredNormRangeAvx512(const void* data, LowType type, int64_t begin, int64_t end);

// Per-path kernels over [begin, end), all elements decayed or none. For the
// dispatcher and tests.
struct CpuAdamScalars {
  float grad_scale, decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float inv_sqrt_bias_correction2, eps, step_size;
};
void CpuAdamRangePortable(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                          const CpuAdamScalars& s);
void CpuAdamRangeAvx2(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                      const CpuAdamScalars& s);
void CpuAdamRangeAvx512(const CpuAdamBuffers& b, int64_t begin, int64_t end, bool decay,
                        const CpuAdamScalars& s);

}  // namespace ferry
