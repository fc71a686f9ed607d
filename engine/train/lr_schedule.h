#pragma once

#include <cstdint>

#include "engine/train/train_options.h"

namespace ferry {

// Learning rate for 0-based `step`: linear warm-up to options.lr over
// options.warmup_steps (step 0 already uses lr / warmup_steps), then cosine
// decay reaching options.min_lr at the last step.
double LearningRate(int64_t step, const TrainOptions& options);

}  // namespace ferry
