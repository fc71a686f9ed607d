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

ChunkOptimizer::ChunkOptimizer(MemoryDevice* device, PayloadStore* store, ChunkTable* table, PayloadMover* mover,
                               const OptimizerOptions& options, Communicator* data)
    : device_(device),
      store_(store),
      table_(table),
      mover_(mover),
      data_(data),
      options_(options),
      simd_(BestSimdPath()) {
  if (options_.overlap) worker_ = std::make_unique<HostWorker>();
}

void ChunkOptimizer::WaitForUpdates() const {
  for (const Chunk& chunk : table_->chunks) {
    if (chunk.update != nullptr) chunk.update->Wait();
  }
}

namespace {

// The chunk's decay ranges as offsets from element `begin` (the CPU kernel
// clips them to the part it updates).
std::vector<DecaySegment> DecayFrom(const Chunk& chunk, int64_t begin) {
  std::vector<DecaySegment> decay = chunk.decay;
  for (DecaySegment& d : decay) d.offset -= begin;
  return decay;
}

}  // namespace

void ChunkOptimizer::Kernel(const Chunk& chunk, int64_t begin, CpuAdamBuffers b, const AdamWHyper& hyper) const {
  CpuAdamWStep(b, DecayFrom(chunk, begin), hyper, simd_);
}

CpuAdamBuffers ChunkOptimizer::WholeChunk(const Chunk& chunk, const at::Tensor& params, const at::Tensor& grads,
                                          const at::Tensor& states) const {
  // This rank's shard of the chunk (all of it, unsharded): the states hold
  // it alone.
  const size_t begin = static_cast<size_t>(chunk.shard_begin);
  CpuAdamBuffers b;
  b.exp_avg = states.data_ptr<float>();
  b.exp_avg_sq = b.exp_avg + chunk.shard_numel;
  b.master = mixed() ? b.exp_avg + 2 * chunk.shard_numel : params.data_ptr<float>() + begin;
  b.grad = static_cast<const char*>(grads.data_ptr()) + begin * grads.element_size();
  b.grad_type = LowTypeOf(grads.scalar_type());
  if (mixed()) {
    b.copy = static_cast<char*>(params.data_ptr()) + begin * params.element_size();
    b.copy_type = LowTypeOf(params.scalar_type());
  }
  b.numel = chunk.shard_used();
  return b;
}

void ChunkOptimizer::UpdateOnCpu(Chunk& chunk, const AdamWHyper& hyper) {
  Kernel(chunk, chunk.shard_begin,
         WholeChunk(chunk, chunk.payload(PayloadKind::kParam).device, chunk.payload(PayloadKind::kGrad).device,
                    chunk.payload(PayloadKind::kOptimizer).device),
         hyper);
}

void ChunkOptimizer::UpdateOnHostBeside(Chunk& chunk, const AdamWHyper& hyper) {
  Payload& p = chunk.payload(PayloadKind::kParam);
  Payload& g = chunk.payload(PayloadKind::kGrad);
  Payload& o = chunk.payload(PayloadKind::kOptimizer);
  if (!p.host_valid || !g.host_valid) {
    throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": host update without current host copies"));
  }
  mover_->AwaitUpdate(chunk);  // the last step's: done, its forward waited for it
  store_->EnsureHost(o);
  if (!chunk.optimizer_initialized) {
    HostAllocationScope host;
    o.host.zero_();
  }
  const CpuAdamBuffers b = WholeChunk(chunk, p.host, g.host, o.host);
  // The task holds only raw buffers and values: the payloads' bookkeeping
  // stays with the training thread, done here as of after the update.
  chunk.update = worker_->Submit([b, decay = DecayFrom(chunk, chunk.shard_begin), hyper, simd = simd_] {
    CpuAdamWStep(b, decay, hyper, simd);
  });
  o.host_valid = true;
  g.host_valid = false;
  g.disk_valid = false;
  p.device_valid = false;
  // A pinned chunk keeps its device buffer, refreshed when next needed.
  if (!p.pinned) store_->Release(p);
  chunk.optimizer_initialized = true;
}

bool UpdatesWithTorchOps(const MemoryDevice& device, const OptimizerOptions& options) {
  return !device.compute_device().is_cpu() || options.device_kernel_on_simulated_device;
}

void ChunkOptimizer::UpdateOnDevice(Chunk& chunk, const AdamWHyper& hyper) {
  Payload& p = chunk.payload(PayloadKind::kParam);
  Payload& g = chunk.payload(PayloadKind::kGrad);
  Payload& o = chunk.payload(PayloadKind::kOptimizer);
  // This rank's shard (the whole chunk, unsharded).
  const int64_t begin = chunk.shard_begin, n = chunk.shard_used(), region = chunk.shard_numel;
  if (!UpdatesWithTorchOps(*device_, options_)) {
    // The simulated device is CPU memory: the same kernel as the host's, so
    // where a chunk lives never changes the numbers.
    UpdateOnCpu(chunk, hyper);
  } else {
    // The decay ranges within the shard, from its start.
    std::vector<DecaySegment> decay;
    for (const DecaySegment& d : chunk.decay) {
      const int64_t lo = std::max(d.offset, begin), hi = std::min(d.offset + d.numel, begin + n);
      if (lo < hi) decay.push_back({lo - begin, hi - lo});
    }
    if (mixed()) {
      at::Tensor master = o.device.narrow(0, 2 * region, n);
      FlatAdamWStep(master, g.device.narrow(0, begin, n).to(at::kFloat), o.device.narrow(0, 0, n),
                    o.device.narrow(0, region, n), decay, hyper);
      p.device.narrow(0, begin, n).copy_(master);
    } else {
      FlatAdamWStep(p.device.narrow(0, begin, n), g.device.narrow(0, begin, n), o.device.narrow(0, 0, n),
                    o.device.narrow(0, region, n), decay, hyper);
    }
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
      g.disk_valid = false;
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
  // The update runs over units: a chunk whose gradients and optimizer
  // states are on the host is one unit; a chunk with either on disk is
  // updated a slice at a time through the staging slots, as a pipeline:
  // while slice k is updated, slices k+1 and k+2 are being read and slice
  // k-1 written. Chunks go in forward order, so the next forward's first
  // chunks are the first ready.
  struct Unit {
    Chunk* chunk;
    int64_t begin;
    int64_t count;
    int slot;
  };
  std::vector<Unit> units;
  std::vector<size_t> staged;
  for (Chunk& chunk : table_->chunks) {
    if (chunk.device_homed()) {
      UpdateOnDevice(chunk, hyper);
      chunk.optimizer_initialized = true;
      continue;
    }
    const Payload& g = chunk.payload(PayloadKind::kGrad);
    const Payload& o = chunk.payload(PayloadKind::kOptimizer);
    const int64_t slice = o.home == Tier::kDisk ? o.slice_elements : g.home == Tier::kDisk ? g.slice_elements : 0;
    // This rank's shard of the chunk (all of it, unsharded).
    const int64_t first = chunk.shard_begin, end = chunk.shard_begin + chunk.shard_used();
    // A sharded chunk's weights are gathered once every rank has updated
    // its shard (below): not beside the next forward.
    if (slice == 0 || end == first) {
      if (worker_ != nullptr && !chunk.sharded()) {
        UpdateOnHostBeside(chunk, hyper);
        ++result.overlapped_updates;
      } else {
        units.push_back({&chunk, first, end - first, -1});
      }
      continue;
    }
    for (int64_t begin = first; begin < end; begin += slice) {
      staged.push_back(units.size());
      units.push_back({&chunk, begin, std::min(slice, end - begin), -1});
    }
  }
  // A staged unit's slot holds its optimizer states' regions, then its
  // gradients.
  auto grad_at = [&](const Chunk& chunk) -> uint64_t {
    const Payload& o = chunk.payload(PayloadKind::kOptimizer);
    return o.home == Tier::kDisk ? store_->SlicePartBytes(o) * static_cast<uint64_t>(o.regions) : 0;
  };
  auto start_read = [&](size_t k) {
    if (k >= staged.size()) return;
    Unit& u = units[staged[k]];
    Payload& g = u.chunk->payload(PayloadKind::kGrad);
    Payload& o = u.chunk->payload(PayloadKind::kOptimizer);
    u.slot = store_->AcquireSlot();
    // The states hold the shard alone: their elements count from its start.
    if (o.home == Tier::kDisk) store_->StartRead(o, u.slot, 0, u.begin - u.chunk->shard_begin, u.count);
    if (g.home == Tier::kDisk) store_->StartRead(g, u.slot, grad_at(*u.chunk), u.begin, u.count);
  };
  const size_t ahead = static_cast<size_t>(kDiskStagingSlots) - 1;
  for (size_t k = 0; k < ahead; ++k) start_read(k);
  size_t next_staged = 0;
  for (const Unit& u : units) {
    Chunk& chunk = *u.chunk;
    Payload& p = chunk.payload(PayloadKind::kParam);
    Payload& g = chunk.payload(PayloadKind::kGrad);
    Payload& o = chunk.payload(PayloadKind::kOptimizer);
    const bool states_on_disk = o.home == Tier::kDisk, grads_on_disk = g.home == Tier::kDisk;
    if (u.begin == chunk.shard_begin) {
      if (!p.host_valid || !(grads_on_disk ? g.disk_valid : g.host_valid)) {
        throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": host update without current host copies"));
      }
      if (!states_on_disk) {
        store_->EnsureHost(o);
        if (!chunk.optimizer_initialized) {
          HostAllocationScope host;
          o.host.zero_();
        }
      }
    }
    if (u.slot >= 0) store_->FinishReads(u.slot);
    // A shard past the chunk's used elements has nothing to update.
    const bool empty = u.count == 0;
    std::vector<at::Tensor> states, grads;
    if (states_on_disk && !empty) states = store_->SliceViews(o, u.slot, 0, u.count);
    if (grads_on_disk && !empty) grads = store_->SliceViews(g, u.slot, grad_at(chunk), u.count);
    // Element `begin` of a region of the states, on disk or on the host.
    auto state = [&](int region) {
      return states_on_disk ? states[static_cast<size_t>(region)].data_ptr<float>()
                            : o.host.data_ptr<float>() + region * chunk.shard_numel + (u.begin - chunk.shard_begin);
    };
    if (!empty) {
      const size_t weight = c10::elementSize(p.dtype);
      CpuAdamBuffers b;
      b.exp_avg = state(0);
      b.exp_avg_sq = state(1);
      // Element `begin` of a host copy: of the chunk, or of the shard it
      // holds (fully sharded).
      auto host_at = [&](const Payload& h) {
        return static_cast<size_t>(h.host.numel() == h.numel ? u.begin : u.begin - h.host_begin) * weight;
      };
      b.master = mixed() ? state(2) : reinterpret_cast<float*>(static_cast<char*>(p.host.data_ptr()) + host_at(p));
      b.grad = grads_on_disk ? grads[0].data_ptr() : static_cast<const char*>(g.host.data_ptr()) + host_at(g);
      b.grad_type = LowTypeOf(g.dtype);
      if (mixed()) {
        b.copy = static_cast<char*>(p.host.data_ptr()) + host_at(p);
        b.copy_type = LowTypeOf(p.dtype);
      }
      b.numel = u.count;
      Kernel(chunk, u.begin, b, hyper);
    }
    if (u.slot >= 0) {
      if (states_on_disk) store_->StartWrite(o, u.slot, 0, u.begin - chunk.shard_begin, u.count);
      start_read(++next_staged + ahead - 1);
    }
    if (u.begin + u.count < chunk.shard_begin + chunk.shard_used()) continue;
    // The chunk is done.
    if (states_on_disk) {
      o.disk_valid = true;
    } else {
      o.host_valid = true;
    }
    g.host_valid = false;
    g.disk_valid = false;
    p.device_valid = false;
    chunk.optimizer_initialized = true;
    if (!chunk.sharded()) ReleaseUpdated(p);
  }
  // Within the step: what the update wrote is on disk before it ends.
  store_->FinishWrites();
  GatherShards();
  return result;
}

void ChunkOptimizer::ReleaseUpdated(Payload& p) {
  if (p.pinned) {
    mover_->Fetch(p, /*prefetch=*/false);  // pinned: refresh the device copy now
  } else {
    store_->Release(p);
  }
}

void ChunkOptimizer::GatherShards() {
  // Every rank has updated its shard of every chunk: each chunk's weights
  // are made whole from the data group's shards, where the update left
  // them (the device copy, or the host copy), in chunk order on every rank
  // -- the order of the collectives must not depend on a rank's own
  // placement.
  for (Chunk& chunk : table_->chunks) {
    if (!chunk.sharded()) continue;
    Payload& p = chunk.payload(PayloadKind::kParam);
    // Fully sharded, the host keeps the shard alone: the weights are
    // gathered where they are next used (PlacementPolicy::Prepare).
    if (p.host_sharded()) {
      if (!p.host_valid) throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": updated weights missing"));
      if (p.resident) store_->Release(p);
      continue;
    }
    const bool on_device = chunk.device_homed();
    at::Tensor whole = on_device ? p.device : p.host;
    if (on_device ? !(p.resident && p.device_valid) : !p.host_valid) {
      throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": updated weights missing for the gather"));
    }
    chunk.GatherShards(data_, whole);
    if (!on_device) ReleaseUpdated(p);
  }
}

}  // namespace ferry
