#include "engine/model/lm_head_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>

namespace ferry {
namespace {

// The unsliced head rounds its logits to the model's type and computes the
// loss from them in fp32; a slice does the same.
at::Tensor AsComputed(const at::Tensor& fp32, c10::ScalarType type) {
  return type == at::kFloat ? fp32 : fp32.to(type).to(at::kFloat);
}

// An operand of the head's products: fp32 values, or natively the model's
// type.
at::Tensor Operand(const at::Tensor& t, bool native) { return native ? t : t.to(at::kFloat); }

// a @ b^T of two operands, as fp32 values of the model's `type`.
at::Tensor Product(const at::Tensor& a, const at::Tensor& b_rows, c10::ScalarType type, bool native) {
  if (native) return at::matmul(a, b_rows.t()).to(at::kFloat);
  return AsComputed(at::matmul(a, b_rows.t()), type);
}

// The forward's scan of the vocabulary, a slice at a time: per row of xc
// (an operand of `type`) the log-sum-exp of its logits x W^T (fp32) and the
// target's logit (0 where the target is not one of W's rows).
std::pair<at::Tensor, at::Tensor> ScanLogits(const at::Tensor& xc, const at::Tensor& weight, const at::Tensor& targets,
                                             int64_t slice_rows, c10::ScalarType type, bool native) {
  const int64_t rows = xc.size(0), vocab = weight.size(0);
  // The log-sum-exp is kept in fp64: rescaling the running sum at each
  // slice would otherwise add its rounding to every softmax value.
  const at::TensorOptions fp32 = xc.options().dtype(at::kFloat);
  at::Tensor running_max = at::full({rows}, -std::numeric_limits<double>::infinity(), fp32.dtype(at::kDouble));
  at::Tensor running_sum = at::zeros({rows}, fp32.dtype(at::kDouble));
  at::Tensor target_logit = at::zeros({rows}, fp32);
  for (int64_t v0 = 0; v0 < vocab; v0 += slice_rows) {
    const int64_t n = std::min(slice_rows, vocab - v0);
    const at::Tensor logits = Product(xc, Operand(weight.narrow(0, v0, n), native), type, native);
    const at::Tensor wide = logits.to(at::kDouble);
    const at::Tensor new_max = at::maximum(running_max, std::get<0>(wide.max(1)));
    running_sum = running_sum * at::exp(running_max - new_max) + at::exp(wide - new_max.unsqueeze(1)).sum(1);
    running_max = new_max;
    const at::Tensor in_slice = targets.ge(v0).logical_and(targets.lt(v0 + n));
    const at::Tensor local = (targets - v0).clamp(0, n - 1).unsqueeze(1);
    target_logit = target_logit + at::where(in_slice, logits.gather(1, local).squeeze(1), at::zeros_like(target_logit));
  }
  return {(running_max + at::log(running_sum)).to(at::kFloat), target_logit};
}

// The backward's pass over the vocabulary, a slice at a time: `slice_grad`
// turns a slice's logits (fp32) into their gradient, which is rounded as
// the forward's logits were and multiplied into the gradients of x (summed
// over the slices in fp64, so that slicing adds no rounding of its own to
// what one product over the whole vocabulary gives) and of W. W's are
// added in place to the parameter's gradient where it has one -- as
// autograd would add the whole, with no W-sized temporary -- and written
// rather than added where `claims` says it holds nothing yet (the slices
// cover every row); else returned whole.
struct SliceGradients {
  at::Tensor x;       // fp64
  at::Tensor weight;  // undefined where added in place
};
SliceGradients BackwardSlices(const at::Tensor& xc, const at::Tensor& weight, const at::Tensor& param,
                              GradientClaims* claims, int64_t slice_rows, c10::ScalarType type, bool native,
                              const std::function<at::Tensor(const at::Tensor&, int64_t, int64_t)>& slice_grad) {
  const int64_t vocab = weight.size(0);
  at::Tensor grad_x = at::zeros(xc.sizes(), xc.options().dtype(at::kDouble));
  const bool in_place = param.grad().defined();
  at::Tensor grad_w = in_place ? param.grad() : at::empty_like(weight);
  const bool fresh = !in_place || (claims != nullptr && claims->Claim(param));
  for (int64_t v0 = 0; v0 < vocab; v0 += slice_rows) {
    const int64_t n = std::min(slice_rows, vocab - v0);
    const at::Tensor w = Operand(weight.narrow(0, v0, n), native);
    at::Tensor g = slice_grad(Product(xc, w, type, native), v0, n);
    g = native ? g.to(type) : AsComputed(g, type);
    grad_x.add_(at::matmul(g, w).to(at::kDouble));
    const at::Tensor part = at::matmul(g.t(), xc).to(grad_w.scalar_type());
    if (fresh) {
      grad_w.narrow(0, v0, n).copy_(part);
    } else {
      grad_w.narrow(0, v0, n).add_(part);
    }
  }
  return {grad_x, in_place ? at::Tensor() : grad_w};
}

// Adds `value` ([rows]) to g at each row's target in slice [v0, v0 + n).
void AddAtTargets(at::Tensor& g, const at::Tensor& targets, int64_t v0, int64_t n, const at::Tensor& value) {
  const at::Tensor in_slice = targets.ge(v0).logical_and(targets.lt(v0 + n));
  const at::Tensor local = (targets - v0).clamp(0, n - 1).unsqueeze(1);
  g.scatter_add_(1, local, at::where(in_slice, value, at::zeros_like(value)).unsqueeze(1));
}

struct SlicedHeadLoss : public torch::autograd::Function<SlicedHeadLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t slice_rows, bool native, int64_t claims) {
    native = native && x.scalar_type() != at::kFloat;
    const auto [lse, target_logit] =
        ScanLogits(Operand(x, native), weight, targets, slice_rows, x.scalar_type(), native);
    ctx->save_for_backward({x, weight, targets, lse});
    ctx->saved_data["slice_rows"] = slice_rows;
    ctx->saved_data["native"] = native;
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["claims"] = claims;
    return (lse - target_logit).mean();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& targets = saved[2];
    const at::Tensor& lse = saved[3];
    const bool native = ctx->saved_data["native"].toBool();
    const int64_t rows = x.size(0);
    // d(mean)/d(logit) = (softmax - onehot) / rows, times the incoming grad.
    const at::Tensor scale = grads[0].to(at::kFloat) / double(rows);
    const at::Tensor minus_one = at::full({rows}, -1.0f, lse.options());
    const SliceGradients g = BackwardSlices(
        Operand(x, native), saved[1], ctx->saved_data["weight"].toTensor(),
        reinterpret_cast<GradientClaims*>(ctx->saved_data["claims"].toInt()), ctx->saved_data["slice_rows"].toInt(),
        x.scalar_type(), native, [&](const at::Tensor& logits, int64_t v0, int64_t n) {
          at::Tensor p = at::exp(logits - lse.unsqueeze(1));
          AddAtTargets(p, targets, v0, n, minus_one);
          return p * scale;
        });
    return {g.x.to(x.scalar_type()), g.weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// One piece of a head split along the vocabulary (LmHeadPieceStats).
struct HeadPieceStats : public torch::autograd::Function<HeadPieceStats> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t slice_rows, bool native, int64_t claims) {
    const c10::ScalarType type = weight.scalar_type();
    native = native && type != at::kFloat;
    const at::Tensor xt = x.to(type);  // exact: x holds values of W's type
    const auto [lse, target_logit] = ScanLogits(Operand(xt, native), weight, targets, slice_rows, type, native);
    ctx->save_for_backward({xt, weight, targets, lse});
    ctx->saved_data["slice_rows"] = slice_rows;
    ctx->saved_data["native"] = native;
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["claims"] = claims;
    return at::stack({lse, target_logit}, 1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xt = saved[0];
    const at::Tensor& targets = saved[2];
    const at::Tensor& lse = saved[3];
    const bool native = ctx->saved_data["native"].toBool();
    const at::Tensor d = grads[0].to(at::kFloat);
    const at::Tensor d_lse = d.select(1, 0).contiguous(), d_target = d.select(1, 1).contiguous();
    const SliceGradients g = BackwardSlices(
        Operand(xt, native), saved[1], ctx->saved_data["weight"].toTensor(),
        reinterpret_cast<GradientClaims*>(ctx->saved_data["claims"].toInt()), ctx->saved_data["slice_rows"].toInt(),
        xt.scalar_type(), native, [&](const at::Tensor& logits, int64_t v0, int64_t n) {
          // d lse / d logit is the softmax; d target / d logit the one-hot.
          at::Tensor p = at::exp(logits - lse.unsqueeze(1)) * d_lse.unsqueeze(1);
          AddAtTargets(p, targets, v0, n, d_target);
          return p;
        });
    return {g.x.to(at::kFloat), g.weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LmHeadCrossEntropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                              int64_t slice_rows, bool native, GradientClaims* claims) {
  return SlicedHeadLoss::apply(x, weight, targets, std::max<int64_t>(1, slice_rows), native,
                               reinterpret_cast<int64_t>(claims));
}

at::Tensor LmHeadPieceStats(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                            int64_t slice_rows, bool native, GradientClaims* claims) {
  return HeadPieceStats::apply(x, weight, targets, std::max<int64_t>(1, slice_rows), native,
                               reinterpret_cast<int64_t>(claims));
}

}  // namespace ferry
