#include "engine/memory/chunk_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry {

int64_t ChunkLayout::wasted_elements() const {
  int64_t wasted = 0;
  for (size_t i = 0; i < capacity.size(); ++i) wasted += capacity[i] - used[i];
  return wasted;
}

double ChunkLayout::waste_fraction() const {
  int64_t total = 0;
  for (int64_t c : capacity) total += c;
  return total > 0 ? double(wasted_elements()) / double(total) : 0.0;
}

absl::StatusOr<ChunkLayout> PackTensors(const std::vector<int64_t>& numels, int64_t chunk_elements) {
  if (chunk_elements <= 0) return absl::InvalidArgumentError("memory.chunk_size: must be positive");
  ChunkLayout layout;
  layout.chunk_elements = chunk_elements;
  bool open = false;  // whether the last chunk is a regular one with room
  for (int64_t n : numels) {
    if (n <= 0) return absl::InvalidArgumentError("cannot place an empty tensor");
    if (n > chunk_elements) {
      layout.capacity.push_back(n);
      layout.used.push_back(n);
      layout.slots.push_back({layout.chunk_count() - 1, 0, n});
      open = false;
      continue;
    }
    if (!open || layout.used.back() + n > chunk_elements) {
      layout.capacity.push_back(chunk_elements);
      layout.used.push_back(0);
      open = true;
    }
    layout.slots.push_back({layout.chunk_count() - 1, layout.used.back(), n});
    layout.used.back() += n;
  }
  return layout;
}

absl::StatusOr<ChunkLayout> SearchChunkLayout(const std::vector<int64_t>& numels,
                                              const ChunkSearchOptions& options) {
  if (numels.empty()) return absl::InvalidArgumentError("no tensors to place");
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  const int64_t step = std::max<int64_t>(1, options.step_elements);
  const int64_t target = std::max<int64_t>(step, total / std::max(1, options.min_chunks));
  // The smallest size worth trying holds the largest tensor that is not given
  // a chunk of its own at the target size.
  int64_t largest_regular = 0;
  for (int64_t n : numels) {
    if (n <= target) largest_regular = std::max(largest_regular, n);
  }
  const int64_t first = std::max(step, (largest_regular + step - 1) / step * step);
  const int64_t last = std::max(first, target / step * step);

  ChunkLayout best;
  bool have_best = false;
  for (int64_t size = first; size <= last; size += step) {
    absl::StatusOr<ChunkLayout> layout = PackTensors(numels, size);
    if (!layout.ok()) return layout.status();
    if (!have_best || layout->wasted_elements() < best.wasted_elements()) {
      best = *std::move(layout);
      have_best = true;
    }
  }
  return best;
}

}  // namespace ferry
