#pragma once

// Timing a piece of work in a benchmark.

#include <algorithm>
#include <chrono>

namespace ferry {

// Fastest of `runs` timed calls after one untimed, in seconds: on a shared
// machine, noise only ever slows a run down.
template <typename Fn>
double Time(int runs, Fn&& fn) {
  fn();
  double best = 1e300;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace ferry
