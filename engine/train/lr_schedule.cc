#include "engine/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ferry {

double LearningRate(int64_t step, const TrainOptions& options) {
  if (step < options.warmup_steps) {
    return options.lr * double(step + 1) / double(options.warmup_steps);
  }
  const int64_t decay_steps = options.steps - options.warmup_steps - 1;
  if (decay_steps <= 0) return options.lr;
  const double progress = std::min(1.0, double(step - options.warmup_steps) / double(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return options.min_lr + (options.lr - options.min_lr) * cosine;
}

}  // namespace ferry
