#pragma once

// How the products that make a parameter's gradient learn whether the memory
// it goes into holds anything yet.
//
// A step's gradients start at zero. Zeroing a large model's gradient memory
// and then adding each product into it costs two passes over that memory a
// step; a product that writes its result there instead, when nothing was
// written before, costs none. The memory manager therefore leaves the
// gradients of parameters written this way unwritten at the start of a step,
// and a writer claims each before its first write.

#include <ATen/Tensor.h>

namespace ferry {

class GradientClaims {
 public:
  virtual ~GradientClaims() = default;
  // True when `param`'s gradient (param.grad()) holds nothing yet this step:
  // the caller must then write every element of it, overwriting rather than
  // adding. It counts as written from now on. False: add to what is there,
  // which is zero where nothing was added yet. Call it only just before
  // writing the gradient.
  virtual bool Claim(const at::Tensor& param) = 0;
};

}  // namespace ferry
