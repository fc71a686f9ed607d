#pragma once

// The language-model head and its cross-entropy in one, over slices of the
// vocabulary: the logits x W^T ([rows x vocab]) and their gradient are never
// whole. The forward keeps a running log-sum-exp per row and the target's
// logit; the backward recomputes each slice's logits, turns them into the
// slice's softmax less the one-hot targets, and accumulates the gradients of
// x and of that slice of W. The head's largest tensors -- the logits, their
// gradient, and in reduced precision an fp32 copy of the whole embedding
// matrix and of its gradient -- become one slice of each.
//
// Where W already has a gradient, W's slices of it are added in place (as
// Megatron's fused weight-gradient accumulation does) and autograd is handed
// none, so no W-sized gradient is ever allocated; else W's gradient is
// returned whole.
//
// In reduced precision the logits and their gradient are rounded to that
// type as the unsliced head rounds them, so training is the same up to the
// order of the softmax's sums. The products compute in fp32 from the
// reduced values, or with `native` in the reduced type itself (fp32
// accumulation where the kernels have it, as oneDNN's bf16 GEMM and cuBLAS
// do): the logits are then the product's own rounding, and the slices'
// gradients of x are summed in fp64 from their reduced values.

#include <ATen/Tensor.h>

#include <cstdint>

#include "engine/common/gradient_claims.h"

namespace ferry {

// The mean cross-entropy of the logits x W^T against `targets`: x is
// [rows, hidden], W [vocab, hidden] (same type), targets [rows] (int64).
// `slice_rows` vocabulary rows are computed at a time. W's gradient is
// added in place where W has one, or written there where `claims` says it
// holds nothing yet.
at::Tensor LmHeadCrossEntropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                              int64_t slice_rows = 4096, bool native = false, GradientClaims* claims = nullptr);

// One piece of a head whose vocabulary is kept in pieces (the rows W
// holds): per row of x, the log-sum-exp of its logits x W^T and the
// target's logit (0 where the target is not among W's rows: `targets` count
// from W's first row), as [rows, 2] fp32. The log-sum-exp of the pieces'
// log-sum-exps less their summed target logits is the row's loss. x is fp32
// holding values of W's type (so that autograd sums the pieces' gradients
// of x in fp32); the products, the slices and W's gradient are as
// LmHeadCrossEntropy's.
at::Tensor LmHeadPieceStats(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                            int64_t slice_rows = 4096, bool native = false, GradientClaims* claims = nullptr);

}  // namespace ferry
