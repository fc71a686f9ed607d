#pragma once

// Inverted dropout: each element is zeroed with probability p and the rest
// are scaled by 1 / (1 - p).
//
// On the CPU the keep mask is a counter-based hash of one 64-bit seed drawn
// from LibTorch's default CPU generator, filled in parallel and kept as one
// byte an element for the backward. LibTorch's own CPU dropout draws a
// Bernoulli variate element by element on one thread and keeps a mask as
// wide as the activations; in a GPT block it cost as much as the rest of the
// forward. On other devices LibTorch's own (fused) dropout runs.
//
// Either way the masks depend only on the generators' state (the CPU one
// is CpuGenerator(): LibTorch's default unless a scope names another), so
// restoring that state replays them: activation recomputation relies on it.

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <vector>

namespace ferry {

// `x` when not training or p == 0; differentiable.
at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training);

// Where a tensor sits in a larger one it is a slice of: along each listed
// dimension (never the last), entries [offset, offset + x.size(dim)) of the
// whole's `whole`. No dimensions: the tensor is the whole.
struct DropoutSlice {
  struct Dim {
    int64_t dim;
    int64_t whole;
    int64_t offset;
  };
  std::vector<Dim> dims;

  // This slice, further sliced along `dim`.
  DropoutSlice Along(int64_t dim, int64_t whole, int64_t offset) const {
    DropoutSlice s = *this;
    s.dims.push_back({dim, whole, offset});
    return s;
  }
};

// Dropout of a slice with the whole tensor's mask: a tensor-parallel rank
// holding some attention heads, or a data-parallel rank holding some rows of
// the batch, drops exactly what one rank with the whole would, so training
// does not depend on the number of ranks. Draws one seed, as ApplyDropout
// of the whole would.
at::Tensor ApplyDropout(const at::Tensor& x, double p, bool training, const DropoutSlice& slice);

// ApplyDropout as a module: on while the module is in training mode.
class DropoutImpl : public torch::nn::Module {
 public:
  // p in [0, 1).
  explicit DropoutImpl(double p);
  at::Tensor forward(const at::Tensor& x) { return ApplyDropout(x, p_, is_training()); }
  at::Tensor forward(const at::Tensor& x, const DropoutSlice& slice) {
    return ApplyDropout(x, p_, is_training(), slice);
  }

 private:
  double p_;
};
TORCH_MODULE(Dropout);

}  // namespace ferry
