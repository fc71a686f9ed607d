#pragma once

// The values in a model's chunks as a whole: filled when the manager is
// made (the model's parameters move into their chunks, or are drawn
// straight into them), saved to and restored from checkpoints, and read as
// the fp32 master weights. Each goes a chunk and a payload at a time, from
// or to wherever the payload's copy lives -- the device, the host or the
// disk tier -- so that no more than one payload is held for it.
//
// Not thread-safe: one training loop drives it, between steps.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "engine/memory/chunk_table.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/payload_store.h"
#include "engine/parallel/communicator.h"

namespace ferry {

class ChunkValues {
 public:
  // Every pointer must outlive this. `param_dtype`: kFloat, or the weights'
  // type in mixed precision (the fp32 masters then sit with the optimizer
  // states).
  // `data`: the data group, which holds the other parts of sharded chunks
  // (null: a group of one).
  ChunkValues(MemoryDevice* device, PayloadStore* store, ChunkTable* table, c10::ScalarType param_dtype,
              Communicator* data = nullptr)
      : device_(device), store_(store), table_(table), param_dtype_(param_dtype), data_(data) {}

  // At construction: every chunk takes its parameters' values (drawn by
  // their `init`, or copied from the tensors as built; none when
  // `values_from_checkpoint`: RestoreState gives them), written to the
  // payloads' homes (the disk tier's masters behind, through the staging
  // buffers); each parameter becomes a view of its chunk's device copy (its
  // gradient of the gradient chunk's), freeing the memory it was built in
  // before the next chunk takes more. `init_scratch_bytes` is counted
  // against the host budget until the end. `on_filled` (if set) hears of
  // each chunk filled, and may stop there by returning false: CANCELLED.
  absl::Status Fill(const std::vector<ManagedParam>& params, bool values_from_checkpoint,
                    uint64_t init_scratch_bytes, const std::function<bool(int filled, int chunks)>& on_filled);

  using StateSink = std::function<absl::Status(const void* data, size_t size)>;
  using StateSource = std::function<absl::Status(void* data, size_t size)>;
  // Every chunk's parameters and optimizer states (with the fp32 masters in
  // mixed precision) into `sink`, in order.
  absl::Status Save(const StateSink& sink) const;
  // The bytes Save writes.
  uint64_t StateBytes() const;
  // Save's `size` bytes, read in order from `source`, into each payload's
  // home tier. INVALID_ARGUMENT if the layout differs.
  absl::Status Restore(uint64_t size, const StateSource& source);
  // Every managed parameter's fp32 (master) values, on the CPU. With
  // sharded chunks in mixed precision, a collective of the data group:
  // every data rank calls it.
  std::vector<at::Tensor> Masters() const;

 private:
  bool mixed() const { return param_dtype_ != c10::kFloat; }
  // The chunk's parameters become views of its device copy.
  void TakeOver(const Chunk& chunk, const std::vector<ManagedParam>& params);

  MemoryDevice* device_;
  PayloadStore* store_;
  ChunkTable* table_;
  c10::ScalarType param_dtype_;
  Communicator* data_;
};

}  // namespace ferry
