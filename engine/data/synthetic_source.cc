#include "engine/data/synthetic_source.h"

#include <algorithm>
#include <numeric>

namespace ferry {

SyntheticSource::SyntheticSource(int64_t vocab_size, int64_t branching, uint64_t chain_seed,
                                 uint64_t sample_seed)
    : vocab_size_(vocab_size), branching_(branching), rng_(sample_seed) {
  std::mt19937_64 chain_rng(chain_seed);
  std::vector<int64_t> all(static_cast<size_t>(vocab_size));
  std::iota(all.begin(), all.end(), 0);
  successors_.reserve(static_cast<size_t>(vocab_size * branching));
  for (int64_t token = 0; token < vocab_size; ++token) {
    // A partial Fisher-Yates shuffle picks `branching` distinct successors.
    for (int64_t k = 0; k < branching; ++k) {
      std::uniform_int_distribution<int64_t> pick(k, vocab_size - 1);
      std::swap(all[k], all[pick(chain_rng)]);
      successors_.push_back(all[k]);
    }
  }
}

void SyntheticSource::SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) {
  tokens->resize(static_cast<size_t>(count * window));
  std::uniform_int_distribution<int64_t> first(0, vocab_size_ - 1);
  std::uniform_int_distribution<int64_t> branch(0, branching_ - 1);
  for (int64_t row = 0; row < count; ++row) {
    int64_t* out = tokens->data() + row * window;
    out[0] = first(rng_);
    for (int64_t j = 1; j < window; ++j) out[j] = successors(out[j - 1])[branch(rng_)];
  }
}

}  // namespace ferry
