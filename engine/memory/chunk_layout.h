#pragma once

// Packing model tensors into flat chunks: which chunk and offset each tensor
// gets, and the chunk size that wastes least for the model at hand. No
// LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

struct TensorSlot {
  int chunk = 0;
  // Offset in elements from the chunk's start.
  int64_t offset = 0;
  int64_t numel = 0;
};

struct ChunkLayout {
  // The size regular chunks have, in elements. A tensor larger than this gets
  // a chunk of its own, exactly its size.
  int64_t chunk_elements = 0;
  // Per chunk: its capacity and the elements its tensors use.
  std::vector<int64_t> capacity;
  std::vector<int64_t> used;
  // One per tensor, in the order given.
  std::vector<TensorSlot> slots;

  int chunk_count() const { return static_cast<int>(capacity.size()); }
  int64_t wasted_elements() const;
  // Capacity left unused, as a fraction of all capacity.
  double waste_fraction() const;
};

// Packs tensors of `numels` (in first-use order) greedily: a tensor goes into
// the current chunk if it fits, else starts the next one; a tensor larger than
// `chunk_elements` gets a chunk of its own. Tensors never span chunks.
absl::StatusOr<ChunkLayout> PackTensors(const std::vector<int64_t>& numels, int64_t chunk_elements);

struct ChunkSearchOptions {
  // Sizes tried are multiples of this (e.g. the model's hidden size).
  // Default 1024.
  int64_t step_elements = 1024;
  // The largest size tried gives about this many chunks, so that placement
  // has something to choose from. Default 8.
  int min_chunks = 8;
};

// The chunk size that wastes least, the smaller on ties. Sizes run from the
// largest tensor that fits `min_chunks` chunks up to total / min_chunks;
// tensors larger than the size chosen get chunks of their own.
absl::StatusOr<ChunkLayout> SearchChunkLayout(const std::vector<int64_t>& numels,
                                              const ChunkSearchOptions& options = {});

}  // namespace ferry
