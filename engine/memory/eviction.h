#pragma once

// Choosing what to evict from the device: the payloads whose next use is
// farthest away first (Belady's rule, with the warm-up's record of which
// period uses what standing in for the future). No LibTorch.

#include <cstdint>
#include <vector>

namespace ferry {

struct EvictionCandidate {
  // The caller's handle for the payload.
  int id = 0;
  uint64_t bytes = 0;
  // Periods until it is needed again (a full cycle or more when not needed
  // again this step).
  int next_use_distance = 0;
  // Its host copy is current, so evicting it moves nothing.
  bool clean = false;
  // It holds nothing that will be needed (e.g. gradients already used):
  // evicting it costs nothing now or later.
  bool dead = false;
};

// The candidates to evict, in order, until at least `bytes_needed` are
// freed: dead payloads first, then clean ones (only a fetch later), then
// dirty ones (a write-back now as well); within each, the farthest next use
// first, then the larger. Returns all candidates if even they are not
// enough.
std::vector<int> ChooseVictims(std::vector<EvictionCandidate> candidates, uint64_t bytes_needed);

// Periods from `period` until the next period in `uses` (sorted; the periods
// of one cycle of `cycle_length`), counting forward and wrapping around; a
// payload with no uses is `2 * cycle_length` away.
int NextUseDistance(const std::vector<int>& uses, int period, int cycle_length);

}  // namespace ferry
