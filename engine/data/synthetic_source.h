#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/data/token_source.h"

namespace ferry {

// Windows drawn from a fixed random Markov chain: every token has `branching`
// distinct successors, each followed with equal probability, and a window
// starts at a uniformly random token. A model that learns the chain reaches
// a loss of ln(branching) nats per token; uniform guessing scores
// ln(vocab_size).
class SyntheticSource : public TokenSource {
 public:
  // Requires 1 <= branching < vocab_size. `chain_seed` fixes the chain,
  // `sample_seed` the windows drawn from it.
  SyntheticSource(int64_t vocab_size, int64_t branching, uint64_t chain_seed,
                  uint64_t sample_seed);

  void SampleWindows(int64_t count, int64_t window, std::vector<int64_t>* tokens) override;
  std::string SavePosition() const override { return EnginePosition("synthetic", rng_); }
  absl::Status RestorePosition(const std::string& position) override {
    return RestoreEnginePosition("synthetic", position, &rng_);
  }

  // The successors of `token`.
  const int64_t* successors(int64_t token) const { return &successors_[token * branching_]; }
  int64_t branching() const { return branching_; }

 private:
  int64_t vocab_size_;
  int64_t branching_;
  std::vector<int64_t> successors_;  // [vocab_size, branching]
  std::mt19937_64 rng_;
};

}  // namespace ferry
