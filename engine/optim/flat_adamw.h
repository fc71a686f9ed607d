#pragma once

// AdamW over flat fp32 buffers (a chunk's parameters, gradients and moments),
// with LibTorch ops, as PyTorch's AdamW computes it: the same operations in
// the same order, element by element.

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace ferry {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // 1-based step number, for bias correction.
  int64_t step = 1;
  // Gradients are multiplied by this first (gradient clipping); 1 skips it.
  double grad_scale = 1.0;
};

// A range of the buffer that gets weight decay.
struct DecaySegment {
  int64_t offset = 0;
  int64_t numel = 0;
};

// Updates `param` in place from `grad` (scaled in place), `exp_avg` and
// `exp_avg_sq` (all 1-D, same length). Decay applies to `decay` segments
// only. Allocates one temporary the size of the buffers.
void FlatAdamWStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq, const std::vector<DecaySegment>& decay,
                   const AdamWHyper& hyper);

}  // namespace ferry
