#pragma once

// Packing model tensors into flat chunks: which chunk and offset each tensor
// gets. No LibTorch.
//
// Tensors are packed in first-use order and a chunk never spans two groups
// (the stages of the forward): a period then needs only its own chunks, and
// each chunk is cut to exactly what it holds, so no chunk capacity is wasted.
// The chunk size bounds how large a chunk may grow; a tensor larger than it
// gets a chunk of its own.

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
  // The most elements a chunk holds, unless a single tensor needs more.
  int64_t chunk_elements = 0;
  // Per chunk: its capacity and the elements its tensors use.
  std::vector<int64_t> capacity;
  std::vector<int64_t> used;
  // One per tensor, in the order given.
  std::vector<TensorSlot> slots;

  int chunk_count() const { return static_cast<int>(capacity.size()); }
  int64_t wasted_elements() const;
  // Capacity no tensor uses, as a fraction of all capacity.
  double waste_fraction() const;
};

// Packs tensors of `numels` in order: a tensor joins the current chunk if it
// is in the same group (`groups`, one per tensor; empty: all one group) and
// fits within `chunk_elements`, else starts the next chunk. A tensor larger
// than `chunk_elements` gets a chunk of its own.
absl::StatusOr<ChunkLayout> PackTensors(const std::vector<int64_t>& numels,
                                        const std::vector<int>& groups, int64_t chunk_elements);

struct ChunkSearchOptions {
  // Sizes tried are multiples of this (e.g. the model's hidden size).
  // Default 1024.
  int64_t step_elements = 1024;
  // At most this many chunks, where a size allows it. Default 64.
  int max_chunks = 64;
};

// The smallest chunk size (a multiple of step_elements) that packs the
// tensors into at most max_chunks chunks: small chunks let placement use
// device memory finely and bound the temporaries of a chunk's update; few
// chunks keep per-chunk work small. When even one chunk per group (or per
// oversized tensor) is more than max_chunks, that is the layout.
absl::StatusOr<ChunkLayout> SearchChunkLayout(const std::vector<int64_t>& numels,
                                              const std::vector<int>& groups,
                                              const ChunkSearchOptions& options = {});

// The layout a run uses: PackTensors with `chunk_elements` when it is set
// (> 0), else SearchChunkLayout with `search`. The chunk manager lays out its
// chunks with it, and the daemon's submit check with the same arguments.
absl::StatusOr<ChunkLayout> ChooseChunkLayout(const std::vector<int64_t>& numels, const std::vector<int>& groups,
                                              int64_t chunk_elements, const ChunkSearchOptions& search);

}  // namespace ferry
