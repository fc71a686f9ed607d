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

absl::StatusOr<ChunkLayout> PackTensors(const std::vector<int64_t>& numels,
                                        const std::vector<int>& groups, int64_t chunk_elements) {
  if (chunk_elements <= 0) return absl::InvalidArgumentError("memory.chunk_size: must be positive");
  if (!groups.empty() && groups.size() != numels.size()) {
    return absl::InvalidArgumentError("one group per tensor");
  }
  ChunkLayout layout;
  layout.chunk_elements = chunk_elements;
  bool open = false;  // the last chunk may take more tensors
  int group = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t n = numels[i];
    if (n <= 0) return absl::InvalidArgumentError("cannot place an empty tensor");
    const int g = groups.empty() ? 0 : groups[i];
    if (g != group) open = false;
    group = g;
    if (!open || layout.used.back() + n > chunk_elements) {
      layout.used.push_back(0);
      open = n <= chunk_elements;
    }
    layout.slots.push_back({static_cast<int>(layout.used.size()) - 1, layout.used.back(), n});
    layout.used.back() += n;
  }
  // Each chunk is exactly as large as what it holds.
  layout.capacity = layout.used;
  return layout;
}

absl::StatusOr<ChunkLayout> SearchChunkLayout(const std::vector<int64_t>& numels,
                                              const std::vector<int>& groups,
                                              const ChunkSearchOptions& options) {
  if (numels.empty()) return absl::InvalidArgumentError("no tensors to place");
  // The largest size worth trying holds a whole group in one chunk; the
  // smallest is what max_chunks chunks of equal size would need.
  int64_t total = 0, largest_group = 0, group_total = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (i > 0 && !groups.empty() && groups[i] != groups[i - 1]) group_total = 0;
    group_total += numels[i];
    largest_group = std::max(largest_group, group_total);
    total += numels[i];
  }
  const int64_t step = std::max<int64_t>(1, options.step_elements);
  const int64_t top = std::max<int64_t>(1, (largest_group + step - 1) / step);
  const int64_t bottom =
      std::min(top, std::max<int64_t>(1, total / std::max(1, options.max_chunks) / step));
  auto pack = [&](int64_t steps) { return PackTensors(numels, groups, steps * step); };
  auto fits = [&](const ChunkLayout& layout) { return layout.chunk_count() <= options.max_chunks; };
  // Grow the size by about 5% at a time until the chunk count fits, then
  // find the smallest size that fits between the last two tried. (Packing in
  // order never needs more chunks when they grow.)
  int64_t low = bottom - 1, high = bottom;
  for (;;) {
    absl::StatusOr<ChunkLayout> layout = pack(high);
    if (!layout.ok()) return layout.status();
    if (fits(*layout) || high >= top) break;
    low = high;
    high = std::min(top, std::max(high + 1, high + high / 20));
  }
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    absl::StatusOr<ChunkLayout> layout = pack(mid);
    if (!layout.ok()) return layout.status();
    (fits(*layout) ? high : low) = mid;
  }
  return pack(high);
}

absl::StatusOr<ChunkLayout> ChooseChunkLayout(const std::vector<int64_t>& numels, const std::vector<int>& groups,
                                              int64_t chunk_elements, const ChunkSearchOptions& search) {
  return chunk_elements > 0 ? PackTensors(numels, groups, chunk_elements) : SearchChunkLayout(numels, groups, search);
}

}  // namespace ferry
