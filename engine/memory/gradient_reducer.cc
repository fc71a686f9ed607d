#include "engine/memory/gradient_reducer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/optim/cpu_adam.h"

namespace ferry {

void GradientReducer::Reduce(Chunk& chunk) {
  chunk.grad_reduced = true;
  if (data_ == nullptr || data_->size() == 1) {
    Complete(chunk);
    return;
  }
  // One all-reduce in flight at a time, overlapping the backward of the
  // stages before this chunk's: finish the previous one, start this one.
  // Its gradients stay put on the device until it is done.
  Finish();
  Payload& g = chunk.payload(PayloadKind::kGrad);
  g.pinned = true;
  pending_chunk_ = &chunk;
  pending_ = data_->StartAllReduce(g.device.narrow(0, 0, chunk.used));
}

void GradientReducer::Finish() {
  if (pending_chunk_ == nullptr) return;
  Chunk& chunk = *pending_chunk_;
  pending_chunk_ = nullptr;
  std::unique_ptr<PendingCollective> work = std::move(pending_);
  work->Wait();
  Payload& g = chunk.payload(PayloadKind::kGrad);
  g.pinned = false;
  // The mean over the data ranks' shares of the batch.
  g.device.narrow(0, 0, chunk.used).div_(data_->size());
  Complete(chunk);
}

void GradientReducer::Complete(Chunk& chunk) {
  Payload& g = chunk.payload(PayloadKind::kGrad);
  at::Tensor grads = g.device.narrow(0, 0, chunk.used);
  // An overflow shows as inf or NaN. On the CPU, one fused pass in fp64
  // over the values as they are. Elsewhere in fp32 whatever the gradients'
  // type, reduced-precision gradients widened a piece at a time: a norm in
  // fp32 of the whole chunk would first copy it whole to fp32 (a 2-byte
  // chunk's size twice over, on the device).
  auto sq_norm = [](const at::Tensor& t) {
    if (t.device().is_cpu() && t.is_contiguous()) {
      static const SimdPath path = BestSimdPath();
      const LowType type = t.scalar_type() == at::kBFloat16 ? LowType::kBFloat16
                           : t.scalar_type() == at::kHalf   ? LowType::kFloat16
                                                            : LowType::kFloat32;
      TORCH_CHECK(type != LowType::kFloat32 || t.scalar_type() == at::kFloat, "gradients of type ", t.scalar_type());
      return CpuSquaredNorm(t.data_ptr(), type, t.numel(), path);
    }
    if (t.scalar_type() == at::kFloat) {
      const double n = at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kFloat).item<double>();
      return n * n;
    }
    constexpr int64_t kPiece = int64_t{1} << 22;
    at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
    for (int64_t i = 0; i < t.numel(); i += kPiece) {
      const at::Tensor piece = t.narrow(0, i, std::min(kPiece, t.numel() - i));
      sum.add_(at::linalg_vector_norm(piece, 2, c10::nullopt, false, at::kFloat).to(at::kDouble).square());
    }
    return sum.item<double>();
  };
  double sq = sq_norm(grads);
  const int tensor_ranks = tensor_ != nullptr ? tensor_->size() : 1;
  if (tensor_ranks > 1) {
    // Summed over the tensor group later: a replicated tensor's share is
    // 1/T on each rank, so that it counts once.
    double replicated = 0;
    for (int i : chunk.tensors) {
      const ManagedTensor& t = table_->tensors[static_cast<size_t>(i)];
      if (t.replicated) replicated += sq_norm(grads.narrow(0, t.offset, t.numel));
    }
    sq -= (1.0 - 1.0 / tensor_ranks) * replicated;
  }
  sq_sum_ += sq;
  // The optimizer states are on the host side: so go the gradients.
  if (!chunk.device_homed()) mover_->Evict(g, /*keep_values=*/true);
}

double GradientReducer::SquaredNorm() {
  if (tensor_ != nullptr && tensor_->size() > 1) {
    at::Tensor sum = at::full({1}, sq_sum_, at::kDouble);
    tensor_->AllReduce(sum);
    sq_sum_ = sum.item<double>();
  }
  return sq_sum_;
}

}  // namespace ferry
