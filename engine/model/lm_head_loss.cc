#include "engine/model/lm_head_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>

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

struct SlicedHeadLoss : public torch::autograd::Function<SlicedHeadLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t slice_rows, bool native, int64_t claims) {
    native = native && x.scalar_type() != at::kFloat;
    const c10::ScalarType type = x.scalar_type();
    const at::Tensor xc = Operand(x, native);
    const int64_t rows = x.size(0), vocab = weight.size(0);
    // The log-sum-exp is kept in fp64: rescaling the running sum at each
    // slice would otherwise add its rounding to every softmax value.
    const at::TensorOptions fp32 = x.options().dtype(at::kFloat);
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
    const at::Tensor lse = (running_max + at::log(running_sum)).to(at::kFloat);
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
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const at::Tensor& lse = saved[3];
    const int64_t slice_rows = ctx->saved_data["slice_rows"].toInt();
    const bool native = ctx->saved_data["native"].toBool();
    const c10::ScalarType type = x.scalar_type();
    const at::Tensor xc = Operand(x, native);
    const int64_t rows = x.size(0), vocab = weight.size(0);
    // d(mean)/d(logit) = (softmax - onehot) / rows, times the incoming grad.
    const at::Tensor scale = grads[0].to(at::kFloat) / double(rows);
    // Summed over the slices in fp64, so that slicing adds no rounding of
    // its own to what one product over the whole vocabulary gives.
    at::Tensor grad_x = at::zeros(x.sizes(), x.options().dtype(at::kDouble));
    // Where W already has a gradient (a chunk's, say), each slice is added
    // to it in place, as autograd would add the whole: no W-sized temporary.
    const at::Tensor param = ctx->saved_data["weight"].toTensor();
    const bool in_place = param.grad().defined();
    at::Tensor grad_w = in_place ? param.grad() : at::empty_like(weight);
    // Where it holds nothing yet, each slice is written rather than added:
    // the slices cover every row.
    auto* claims = reinterpret_cast<GradientClaims*>(ctx->saved_data["claims"].toInt());
    const bool fresh = !in_place || (claims != nullptr && claims->Claim(param));
    for (int64_t v0 = 0; v0 < vocab; v0 += slice_rows) {
      const int64_t n = std::min(slice_rows, vocab - v0);
      const at::Tensor w = Operand(weight.narrow(0, v0, n), native);
      const at::Tensor logits = Product(xc, w, type, native);
      at::Tensor g = at::exp(logits - lse.unsqueeze(1));
      const at::Tensor in_slice = targets.ge(v0).logical_and(targets.lt(v0 + n));
      const at::Tensor local = (targets - v0).clamp(0, n - 1).unsqueeze(1);
      g.scatter_add_(1, local, at::where(in_slice, at::full({rows}, -1.0f, g.options()), at::zeros({rows}, g.options()))
                                   .unsqueeze(1));
      g = native ? (g * scale).to(type) : AsComputed(g * scale, type);
      grad_x.add_(at::matmul(g, w).to(at::kDouble));
      const at::Tensor part = at::matmul(g.t(), xc).to(grad_w.scalar_type());
      if (fresh) {
        grad_w.narrow(0, v0, n).copy_(part);
      } else {
        grad_w.narrow(0, v0, n).add_(part);
      }
    }
    return {grad_x.to(type), in_place ? at::Tensor() : grad_w, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LmHeadCrossEntropy(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& targets,
                              int64_t slice_rows, bool native, GradientClaims* claims) {
  return SlicedHeadLoss::apply(x, weight, targets, std::max<int64_t>(1, slice_rows), native,
                               reinterpret_cast<int64_t>(claims));
}

}  // namespace ferry
