#include "engine/optim/loss_scaler.h"

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

}  // namespace ferry
