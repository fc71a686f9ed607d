#include "engine/optim/flat_adamw.h"

#include <ATen/ATen.h>

#include <cmath>

namespace ferry {

void FlatAdamWStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq, const std::vector<DecaySegment>& decay,
                   const AdamWHyper& h) {
  if (h.grad_scale != 1.0) grad.mul_(h.grad_scale);
  if (h.weight_decay != 0.0) {
    for (const DecaySegment& s : decay) param.narrow(0, s.offset, s.numel).mul_(1 - h.lr * h.weight_decay);
  }
  exp_avg.mul_(h.beta1).add_(grad, 1 - h.beta1);
  exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
  const double bias_correction1 = 1 - std::pow(h.beta1, double(h.step));
  const double bias_correction2 = 1 - std::pow(h.beta2, double(h.step));
  at::Tensor denom = exp_avg_sq.sqrt();
  denom.div_(std::sqrt(bias_correction2)).add_(h.eps);
  param.addcdiv_(exp_avg, denom, -h.lr / bias_correction1);
}

}  // namespace ferry
