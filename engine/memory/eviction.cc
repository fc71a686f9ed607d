#include "engine/memory/eviction.h"

#include <algorithm>

namespace ferry {

std::vector<int> ChooseVictims(std::vector<EvictionCandidate> candidates, uint64_t bytes_needed) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const EvictionCandidate& a, const EvictionCandidate& b) {
                     if (a.dead != b.dead) return a.dead;
                     // A dirty payload costs a write-back now and a fetch
                     // later; a clean one only the fetch.
                     if (a.clean != b.clean) return a.clean;
                     if (a.next_use_distance != b.next_use_distance) {
                       return a.next_use_distance > b.next_use_distance;
                     }
                     return a.bytes > b.bytes;
                   });
  std::vector<int> victims;
  uint64_t freed = 0;
  for (const EvictionCandidate& c : candidates) {
    if (freed >= bytes_needed) break;
    victims.push_back(c.id);
    freed += c.bytes;
  }
  return victims;
}

int NextUseDistance(const std::vector<int>& uses, int period, int cycle_length) {
  if (uses.empty()) return 2 * cycle_length;
  auto it = std::upper_bound(uses.begin(), uses.end(), period);
  if (it != uses.end()) return *it - period;
  return uses.front() + cycle_length - period;
}

}  // namespace ferry
