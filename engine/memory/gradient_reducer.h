#pragma once

// A chunk's gradients once its backward is complete: averaged over the data
// group (in the background, while the backward goes on) -- all-reduced, or
// for a sharded chunk reduce-scattered, each rank getting the average of
// its shard alone -- their squared norm summed for clipping and the
// overflow check (over every shard: the data group agrees on it), and sent
// where the chunk's optimizer runs (kept on the device for a chunk updated
// there).
//
// Not thread-safe: one training loop drives it.

#include <ATen/Tensor.h>

#include <memory>

#include "engine/memory/chunk_table.h"
#include "engine/memory/payload_mover.h"
#include "engine/parallel/communicator.h"

namespace ferry {

class GradientReducer {
 public:
  // Every pointer must outlive the reducer; null groups are groups of one.
  GradientReducer(ChunkTable* table, PayloadMover* mover, Communicator* tensor_group, Communicator* data_group)
      : table_(table), mover_(mover), tensor_(tensor_group), data_(data_group) {}

  // A new step: no gradient reduced yet.
  void BeginStep() {
    sq_sum_ = 0;
    device_sq_sum_ = at::Tensor();
  }
  // The chunk's gradients are complete.
  void Reduce(Chunk& chunk);
  // The chunk's backward is done for a micro-batch before the step's last
  // (gradient accumulation): its gradients so far, neither reduced nor
  // normed, stay on the device for a chunk updated there, and otherwise go
  // to its host side (kept), to be fetched back and added to by the next
  // micro-batch's backward.
  void Hold(Chunk& chunk);
  // Waits for the reduction in flight, if any, and completes its chunk.
  void Finish();
  // After every chunk is reduced: the squared norm of all the gradients
  // (scaled by the loss scale), summed over the tensor group (and over the
  // data group's shards, where chunks are sharded); inf or NaN when any
  // overflowed, on every rank alike.
  double SquaredNorm();

 private:
  void Complete(Chunk& chunk);

  ChunkTable* table_;
  PayloadMover* mover_;
  Communicator* tensor_;
  Communicator* data_;
  double sq_sum_ = 0;
  // Off the CPU: the squared norms so far, on the device.
  at::Tensor device_sq_sum_;
  // The chunk whose data-parallel reduction is in flight; for a sharded
  // chunk, the buffer its shard of the sum arrives in.
  Chunk* pending_chunk_ = nullptr;
  std::unique_ptr<PendingCollective> pending_;
  at::Tensor pending_shard_;
  // Some chunk is sharded: each rank's squared norm covers its shards.
  bool sharded_ = false;
};

}  // namespace ferry
