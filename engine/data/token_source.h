#pragma once

// Where training tokens come from. Free of LibTorch: sources fill plain
// vectors and the trainer wraps them in tensors.

#include <cstdint>
#include <vector>

namespace ferry {

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Replaces `tokens` with `count` windows of `window` consecutive tokens,
  // row-major ([count, window]). Deterministic for a source's seed and the
  // sequence of calls. Not thread-safe.
  virtual void SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) = 0;
};

}  // namespace ferry
