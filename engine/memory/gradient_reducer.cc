#include "engine/memory/gradient_reducer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

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
  if (chunk.sharded()) {
    sharded_ = true;
    pending_shard_ = at::empty({chunk.shard_numel}, g.device.options());
    pending_ = data_->StartReduceScatter(g.device.narrow(0, 0, chunk.capacity), pending_shard_);
  } else {
    pending_ = data_->StartAllReduce(g.device.narrow(0, 0, chunk.used));
  }
}

void GradientReducer::Hold(Chunk& chunk) {
  // The same device memory as after the step's last backward: only chunks
  // updated on the device keep gradients there.
  if (!chunk.device_homed()) mover_->Evict(chunk.payload(PayloadKind::kGrad), /*keep_values=*/true);
}

void GradientReducer::Finish() {
  if (pending_chunk_ == nullptr) return;
  Chunk& chunk = *pending_chunk_;
  pending_chunk_ = nullptr;
  std::unique_ptr<PendingCollective> work = std::move(pending_);
  work->Wait();
  Payload& g = chunk.payload(PayloadKind::kGrad);
  g.pinned = false;
  // The mean over the data ranks' shares of the batch (of this rank's shard
  // alone, for a sharded chunk: the rest is left as it was).
  if (chunk.sharded()) {
    g.device.narrow(0, chunk.shard_begin, chunk.shard_numel).copy_(pending_shard_).div_(data_->size());
    pending_shard_ = at::Tensor();
  } else {
    g.device.narrow(0, 0, chunk.used).div_(data_->size());
  }
  Complete(chunk);
}

namespace {

// The squared L2 norm of `t`; an overflow shows as inf or NaN. On the CPU,
// one fused pass in fp64 over the values as they are.
double CpuSquaredNormOf(const at::Tensor& t) {
  static const SimdPath path = BestSimdPath();
  const at::Tensor c = t.contiguous();
  const LowType type = LowTypeOf(c.scalar_type());
  TORCH_CHECK(type != LowType::kFloat32 || c.scalar_type() == at::kFloat, "gradients of type ", c.scalar_type());
  return CpuSquaredNorm(c.data_ptr(), type, c.numel(), path);
}

// The same on another device, as a 0-d fp64 tensor there: no host sync. In
// fp32 whatever the gradients' type, reduced-precision gradients widened a
// piece at a time: a norm in fp32 of the whole chunk would first copy it
// whole to fp32 (a 2-byte chunk's size twice over, on the device).
at::Tensor DeviceSquaredNormOf(const at::Tensor& t) {
  constexpr int64_t kPiece = int64_t{1} << 22;
  at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
  for (int64_t i = 0; i < t.numel(); i += kPiece) {
    const at::Tensor piece = t.narrow(0, i, std::min(kPiece, t.numel() - i));
    sum.add_(at::linalg_vector_norm(piece, 2, c10::nullopt, false, at::kFloat).to(at::kDouble).square());
  }
  return sum;
}

}  // namespace

void GradientReducer::Complete(Chunk& chunk) {
  Payload& g = chunk.payload(PayloadKind::kGrad);
  // This rank's shard of the gradients (all of them, unsharded).
  const int64_t begin = chunk.shard_begin;
  at::Tensor grads = g.device.narrow(0, begin, chunk.shard_used());
  // Replicated tensors (tensor parallelism) count 1/T on each rank, so that
  // the sum over the tensor group counts them once: what of each lies in
  // the shard.
  const int tensor_ranks = tensor_ != nullptr ? tensor_->size() : 1;
  const double replicated_share = 1.0 - 1.0 / tensor_ranks;
  std::vector<std::pair<int64_t, int64_t>> replicated;  // offsets in `grads`, lengths
  for (int i : chunk.tensors) {
    const ManagedTensor& t = table_->tensors[static_cast<size_t>(i)];
    if (tensor_ranks == 1 || !t.replicated) continue;
    const int64_t lo = std::max(t.offset, begin), hi = std::min(t.offset + t.numel, begin + grads.numel());
    if (lo < hi) replicated.emplace_back(lo - begin, hi - lo);
  }
  if (grads.device().is_cpu()) {
    double sq = CpuSquaredNormOf(grads);
    for (const auto& [offset, length] : replicated) {
      sq -= replicated_share * CpuSquaredNormOf(grads.narrow(0, offset, length));
    }
    sq_sum_ += sq;
  } else {
    // Summed on the device; the host reads it once a step (SquaredNorm).
    at::Tensor sq = DeviceSquaredNormOf(grads);
    for (const auto& [offset, length] : replicated) {
      sq.sub_(DeviceSquaredNormOf(grads.narrow(0, offset, length)).mul_(replicated_share));
    }
    device_sq_sum_ = device_sq_sum_.defined() ? device_sq_sum_.add_(sq) : sq;
  }
  // The optimizer states are on the host side: so go the gradients.
  if (!chunk.device_homed()) mover_->Evict(g, /*keep_values=*/true);
}

double GradientReducer::SquaredNorm() {
  if (device_sq_sum_.defined()) {
    sq_sum_ += device_sq_sum_.item<double>();  // the step's one host sync for it
    device_sq_sum_ = at::Tensor();
  }
  // Over the shards of the data group, then over the tensor group: every
  // rank has the same norm (and so the same clipping and the same verdict
  // on an overflow).
  for (Communicator* group : {sharded_ ? data_ : nullptr, tensor_}) {
    if (group == nullptr || group->size() == 1) continue;
    at::Tensor sum = at::full({1}, sq_sum_, at::kDouble);
    group->AllReduce(sum);
    sq_sum_ = sum.item<double>();
  }
  return sq_sum_;
}

}  // namespace ferry
