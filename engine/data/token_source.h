#pragma once

// Where training tokens come from. Free of LibTorch: sources fill plain
// vectors and the trainer wraps them in tensors.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ferry {

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Replaces `tokens` with `count` windows of `window` consecutive tokens,
  // row-major ([count, window]). Deterministic for a source's seed and the
  // sequence of calls. Not thread-safe.
  virtual void SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) = 0;

  // Where the source is in its sequence of windows, as text (for a
  // checkpoint); restoring it makes the following calls draw what they
  // would have drawn then. INVALID_ARGUMENT for text that is not a position
  // of this kind of source.
  virtual std::string SavePosition() const = 0;
  virtual absl::Status RestorePosition(const std::string& position) = 0;
};

// The two halves of Save/RestorePosition for a source that draws from a
// std::mt19937_64: "KIND ENGINE-STATE".
std::string EnginePosition(const char* kind, const std::mt19937_64& engine);
absl::Status RestoreEnginePosition(const char* kind, const std::string& position, std::mt19937_64* engine);

}  // namespace ferry
