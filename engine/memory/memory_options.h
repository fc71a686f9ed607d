#pragma once

// How the memory manager places a job's model data. No LibTorch: the job-spec
// code fills it.

#include <cstdint>
#include <string>

namespace ferry {

struct MemoryOptions {
  enum class Policy { kAuto, kStatic };
  Policy policy = Policy::kAuto;
  // Host bytes for model data: host copies of chunks, the disk tier's
  // staging buffers, and the model's values while they move into chunks at
  // construction. Enforced: a host allocation past it fails with a message.
  // 0: no limit of its own (the worker passes a default it derives from the
  // machine; see DefaultHostBudgetBytes in tier_plan.h).
  uint64_t host_budget_bytes = 0;
  // The disk tier: a directory for chunk files (created if missing; the
  // manager's files live in a scratch directory inside it, removed when the
  // manager goes) and the bytes they may take. An empty directory or a zero
  // budget turns the tier off: every payload then lives on the host.
  std::string disk_dir;
  uint64_t disk_budget_bytes = 0;
  // Read and write disk files with O_DIRECT (page cache bypassed) where the
  // file system allows it.
  bool disk_direct_io = true;
  // The most elements a chunk may hold; 0 searches for a size.
  int64_t chunk_elements = 0;
  // The search tries multiples of this; 0 lets the trainer use the model's
  // hidden size.
  int64_t chunk_step_elements = 0;
  // The search picks the smallest chunk size that needs at most this many
  // chunks.
  int max_chunks = 64;
  // static: fractions of chunks whose parameters / optimizer states live on
  // the host. (0, 1) is ZeRO-Offload's split.
  double static_param_host_fraction = 0.0;
  double static_optimizer_host_fraction = 1.0;
  // auto: fraction of the device kept free beyond the predicted need.
  double margin = 0.05;
  // auto: fetch the next period's chunks ahead of time when room allows.
  bool prefetch = true;
  // Activation recomputation of the stages that allow it (the transformer
  // blocks): none; all; every k-th (block index % k == 0); or auto, the
  // fewest that let the step fit the device with the margin, chosen from the
  // warm-up (which recomputes every block, to measure what each one saves).
  enum class Recompute { kNone, kAll, kEvery, kAuto };
  Recompute recompute = Recompute::kAuto;
  int recompute_every = 2;
  // The chunks' values come from RestoreState before the first step (a
  // resume): the manager fills no chunk when it is made -- no initial value
  // is drawn or copied, none written to the disk tier only to be replaced.
  bool values_from_checkpoint = false;
  // Micro-batches a step (the trainer sets it from train.grad_accum_steps):
  // the tier plan prices gradients on disk by it (TierInput::micro_batches).
  int micro_batches = 1;
  // With a data group of more than one rank (ZeRO-style sharding; the job
  // spec's parallel.shard): none, every rank holds and updates every chunk
  // whole; optimizer, each data rank owns 1/D of every chunk -- its part of
  // the optimizer states (with the fp32 masters in mixed precision) -- and
  // updates only that part: gradients are reduce-scattered instead of
  // all-reduced, and the updated weights all-gathered after the update;
  // full, the host side of the weights and gradients too holds only the
  // rank's part (a rank keeps 1/D of all its model data), the weights
  // gathered whole on the device as a period needs them and released after.
  enum class Shard { kNone, kOptimizer, kFull };
  Shard shard = Shard::kNone;
};

inline const char* PolicyName(MemoryOptions::Policy policy) {
  return policy == MemoryOptions::Policy::kAuto ? "auto" : "static";
}

}  // namespace ferry
