#include "engine/optim/loss_scaler.h"

#include <cstdio>

#include <algorithm>

namespace ferry {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(std::clamp(options.initial_scale, options.min_scale, options.max_scale)) {}

void DynamicLossScaler::Update(bool overflow) {
  if (overflow) {
    ++skipped_;
    clean_steps_ = 0;
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    return;
  }
  if (++clean_steps_ >= options_.growth_interval) {
    clean_steps_ = 0;
    scale_ = std::min(options_.max_scale, scale_ * options_.growth_factor);
  }
}

std::string DynamicLossScaler::State() const {
  char buffer[96];
  std::snprintf(buffer, sizeof(buffer), "%a %lld %lld", scale_, static_cast<long long>(clean_steps_),
                static_cast<long long>(skipped_));
  return buffer;
}

bool DynamicLossScaler::Restore(const std::string& state) {
  double scale = 0;
  long long clean = 0, skipped = 0;
  if (std::sscanf(state.c_str(), "%la %lld %lld", &scale, &clean, &skipped) != 3 || !(scale > 0)) return false;
  scale_ = scale;
  clean_steps_ = clean;
  skipped_ = skipped;
  return true;
}

}  // namespace ferry
