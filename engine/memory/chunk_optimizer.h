#pragma once

// AdamW over the chunks, each where its optimizer states live: on the device
// for chunks the plan homes there, with the CPU kernel (cpu_adam.h) on the
// host side otherwise -- for a chunk whose states or gradients are on disk a
// slice at a time through the staging slots, as a pipeline: while slice k is
// updated, the next slices are being read and slice k-1 written.
//
// Overlapped (OptimizerOptions::overlap), the chunks updated on the host
// with their states in host memory are updated by a worker thread, in
// forward order, while the training loop goes on into the next step's
// forward: each chunk's update is a task (Chunk::update) that the forward
// waits for only when it reaches that chunk. Everything the update decides
// -- the unscaling, the clipping coefficient from the global norm, whether
// an overflow skips the step -- is fixed before the first task starts, and
// each task runs the same kernel on the same values as the synchronous
// update, so the weights are bitwise the same.
//
// Not thread-safe: one training loop drives it (the CPU kernel, the worker
// and the disk store use threads of their own).

#include <cstdint>
#include <memory>

#include "engine/memory/chunk_table.h"
#include "engine/memory/host_worker.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/payload_mover.h"
#include "engine/memory/payload_store.h"
#include "engine/optim/cpu_adam.h"
#include "engine/parallel/communicator.h"

namespace ferry {

// Hyper-parameters of the optimizer that do not change over training, and
// the precision of the weights the model computes with.
struct OptimizerOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // kFloat, or kHalf / kBFloat16 for mixed precision: weights and gradients
  // in that type, fp32 master weights kept with the optimizer states.
  c10::ScalarType param_dtype = c10::kFloat;
  // Host-side updates run beside the next step's forward (see above).
  bool overlap = false;
  // On the simulated device, chunks updated on the device use the kernel a
  // GPU runs (FlatAdamWStep, LibTorch ops) rather than the host's CPU
  // kernel, so that the GPU's update path runs on every machine (tests).
  // The two agree to rounding, not bitwise.
  bool device_kernel_on_simulated_device = false;
};

// Whether chunks updated on `device` go through FlatAdamWStep (which
// allocates temporaries the plan must leave room for).
bool UpdatesWithTorchOps(const MemoryDevice& device, const OptimizerOptions& options);

struct OptimizerResult {
  // The global gradient norm before clipping (unscaled).
  double grad_norm = 0;
  // The gradients overflowed: nothing was updated.
  bool skipped = false;
  // Chunks whose update was left running beside the training loop.
  int overlapped_updates = 0;
};

class ChunkOptimizer {
 public:
  // Every pointer must outlive the optimizer; `data`, the data group that
  // holds the other shards of sharded chunks, may be null (a group of one).
  ChunkOptimizer(MemoryDevice* device, PayloadStore* store, ChunkTable* table, PayloadMover* mover,
                 const OptimizerOptions& options, Communicator* data = nullptr);

  // One update of every chunk, its gradients (reduced, where the chunk's
  // optimizer runs) scaled by `loss_scale` with squared norm `sq_norm`:
  // unscaled, clipped to `max_grad_norm` (0: no clipping) and applied with
  // learning rate `lr`; `step` is the 1-based count of applied updates. An
  // inf or NaN norm skips the update: no weight or state changes, and the
  // gradients are dropped.
  // Overlapped, the host-side updates may still be running on return.
  OptimizerResult Step(int64_t step, double lr, double max_grad_norm, double loss_scale, double sq_norm);
  // Waits for every update still running beside the training loop (and
  // throws the first error one ended with): before the chunks' values are
  // read whole (a checkpoint, the master weights).
  void WaitForUpdates() const;

  bool mixed() const { return options_.param_dtype != c10::kFloat; }
  const OptimizerOptions& options() const { return options_; }

 private:
  void UpdateOnDevice(Chunk& chunk, const AdamWHyper& hyper);
  // The CPU kernel over the chunk's device copies (the simulated device is
  // CPU memory).
  void UpdateOnCpu(Chunk& chunk, const AdamWHyper& hyper);
  // The CPU kernel's buffers over a whole chunk's copies (all on the
  // device, or all on the host).
  CpuAdamBuffers WholeChunk(const Chunk& chunk, const at::Tensor& params, const at::Tensor& grads,
                            const at::Tensor& states) const;
  // The CPU kernel over elements [begin, begin + b.numel) of the chunk.
  void Kernel(const Chunk& chunk, int64_t begin, CpuAdamBuffers b, const AdamWHyper& hyper) const;
  // A chunk with its states and gradients in host memory: its update
  // submitted to the worker, its copies marked as they will be once it has
  // run (the host copies current, the device's parameters stale).
  void UpdateOnHostBeside(Chunk& chunk, const AdamWHyper& hyper);
  // After a host-side update: a pinned chunk's device copy refreshed, any
  // other released.
  void ReleaseUpdated(Payload& p);
  // Sharded chunks: each one's weights made whole from the data group's
  // updated shards, in chunk order.
  void GatherShards();

  MemoryDevice* device_;
  PayloadStore* store_;
  ChunkTable* table_;
  PayloadMover* mover_;
  Communicator* data_;
  OptimizerOptions options_;
  SimdPath simd_;
  // Overlapped: the thread the host-side updates run on.
  std::unique_ptr<HostWorker> worker_;
};

}  // namespace ferry
