#include "engine/memory/chunk_optimizer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/memory/simulated_device.h"
#include "engine/optim/flat_adamw.h"

namespace ferry {
namespace {

LowType LowTypeOf(c10::ScalarType t) {
  return t == at::kHalf ? LowType::kFloat16 : t == at::kBFloat16 ? LowType::kBFloat16 : LowType::kFloat32;
}

}  // namespace

ChunkOptimizer::ChunkOptimizer(MemoryDevice* device, PayloadStore* store, ChunkTable* table, PayloadMover* mover,
                               const OptimizerOptions& options)
    : device_(device), store_(store), table_(table), mover_(mover), options_(options), simd_(BestSimdPath()) {}

void ChunkOptimizer::UpdateOnCpu(Chunk& chunk, bool device_copies, const AdamWHyper& hyper) {
  Payload& p = chunk.payload(PayloadKind::kParam);
  Payload& g = chunk.payload(PayloadKind::kGrad);
  Payload& o = chunk.payload(PayloadKind::kOptimizer);
  const at::Tensor& params = device_copies ? p.device : p.host;
  const at::Tensor& states = device_copies ? o.device : o.host;
  const at::Tensor& grads = device_copies ? g.device : g.host;
  CpuAdamBuffers b;
  b.master = mixed() ? states.data_ptr<float>() + 2 * chunk.capacity : params.data_ptr<float>();
  b.grad = grads.data_ptr();
  b.grad_type = LowTypeOf(g.dtype);
  b.exp_avg = states.data_ptr<float>();
  b.exp_avg_sq = states.data_ptr<float>() + chunk.capacity;
  if (mixed()) {
    b.copy = params.data_ptr();
    b.copy_type = LowTypeOf(p.dtype);
  }
  b.numel = chunk.used;
  CpuAdamWStep(b, chunk.decay, hyper, simd_);
}

void ChunkOptimizer::UpdateOnDevice(Chunk& chunk, const AdamWHyper& hyper) {
  Payload& p = chunk.payload(PayloadKind::kParam);
  Payload& g = chunk.payload(PayloadKind::kGrad);
  Payload& o = chunk.payload(PayloadKind::kOptimizer);
  const int64_t n = chunk.used;
  if (device_->compute_device().is_cpu()) {
    // The simulated device is CPU memory: the same kernel as the host's, so
    // where a chunk lives never changes the numbers.
    UpdateOnCpu(chunk, /*device_copies=*/true, hyper);
  } else if (mixed()) {
    at::Tensor master = o.device.narrow(0, 2 * chunk.capacity, n);
    FlatAdamWStep(master, g.device.narrow(0, 0, n).to(at::kFloat), o.device.narrow(0, 0, n),
                  o.device.narrow(0, chunk.capacity, n), chunk.decay, hyper);
    p.device.narrow(0, 0, n).copy_(master);
  } else {
    FlatAdamWStep(p.device.narrow(0, 0, n), g.device.narrow(0, 0, n), o.device.narrow(0, 0, n),
                  o.device.narrow(0, chunk.capacity, n), chunk.decay, hyper);
  }
  // The device copies are the only current ones: the host (and the disk)
  // no longer mirror them.
  store_->ReleaseHost(p);
  store_->ReleaseHost(o);
  o.disk_valid = false;
  store_->ReleaseHost(g);
  store_->Release(g);  // used up; the next backward starts it afresh
}

OptimizerResult ChunkOptimizer::Step(int64_t step, double lr, double max_grad_norm, double loss_scale,
                                     double sq_norm) {
  OptimizerResult result;
  if (!std::isfinite(sq_norm)) {
    // Overflow: drop this step's gradients and leave every weight and state
    // as it was.
    result.grad_norm = std::numeric_limits<double>::infinity();
    result.skipped = true;
    for (Chunk& chunk : table_->chunks) {
      Payload& g = chunk.payload(PayloadKind::kGrad);
      g.host_valid = false;
      store_->Release(g);
    }
    return result;
  }
  result.grad_norm = std::sqrt(sq_norm) / loss_scale;
  double clip = 1.0;
  if (max_grad_norm > 0) {
    // As torch::nn::utils::clip_grad_norm_ computes it.
    const double coef = max_grad_norm / (result.grad_norm + 1e-6);
    if (coef < 1.0) clip = coef;
  }
  AdamWHyper hyper;
  hyper.lr = lr;
  hyper.beta1 = options_.beta1;
  hyper.beta2 = options_.beta2;
  hyper.eps = options_.eps;
  hyper.weight_decay = options_.weight_decay;
  hyper.step = step;
  hyper.grad_scale = clip / loss_scale;
  device_->SynchronizeTransfers();
  // Chunks whose optimizer states are on disk are updated through the
  // staging buffers as a pipeline: while chunk k is updated, chunk k+1's
  // states are being read and chunk k-1's written. Chunks go in forward
  // order, so the next forward's first chunks are the first ready.
  std::vector<Chunk*> from_disk;
  for (Chunk& chunk : table_->chunks) {
    if (chunk.payload(PayloadKind::kOptimizer).home == Tier::kDisk && !chunk.device_homed()) {
      from_disk.push_back(&chunk);
    }
  }
  const size_t buffers = static_cast<size_t>(store_->staging_count());
  std::vector<DiskStore::Ticket> reads(from_disk.size(), 0), writes(from_disk.size(), 0);
  auto states = [&](size_t k) -> Payload& { return from_disk[k]->payload(PayloadKind::kOptimizer); };
  auto start_read = [&](size_t k) {
    if (k < from_disk.size()) reads[k] = store_->StartLoad(states(k), static_cast<int>(k % buffers));
  };
  // Reads run ahead by buffers - 1 chunks: the last buffer is the one being
  // written behind.
  for (size_t k = 0; k + 1 < buffers; ++k) start_read(k);
  size_t next_disk = 0;
  for (Chunk& chunk : table_->chunks) {
    if (chunk.device_homed()) {
      UpdateOnDevice(chunk, hyper);
      chunk.optimizer_initialized = true;
      continue;
    }
    Payload& p = chunk.payload(PayloadKind::kParam);
    Payload& g = chunk.payload(PayloadKind::kGrad);
    Payload& o = chunk.payload(PayloadKind::kOptimizer);
    if (!p.host_valid || !g.host_valid) {
      throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": host update without current host copies"));
    }
    const bool on_disk = o.home == Tier::kDisk;
    const size_t k = next_disk;
    if (on_disk) {
      store_->FinishLoad(o, reads[k]);
    } else {
      store_->EnsureHost(o);
      if (!chunk.optimizer_initialized) {
        HostAllocationScope host;
        o.host.zero_();
      }
    }
    UpdateOnCpu(chunk, /*device_copies=*/false, hyper);
    o.host_valid = true;
    g.host_valid = false;
    p.device_valid = false;
    if (on_disk) {
      writes[k] = store_->StartStore(o);
      ++next_disk;
      // Chunk k-1's buffer is the one chunk k+buffers-1 reads into.
      if (k >= 1) store_->FinishStore(states(k - 1), writes[k - 1]);
      start_read(k + buffers - 1);
    }
    if (p.pinned) {
      mover_->Fetch(p, /*prefetch=*/false);  // pinned: refresh the device copy now
    } else {
      store_->Release(p);
    }
    chunk.optimizer_initialized = true;
  }
  if (!from_disk.empty()) store_->FinishStore(states(from_disk.size() - 1), writes.back());
  return result;
}

}  // namespace ferry
