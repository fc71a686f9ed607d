#pragma once

#include <string>

// Dynamic loss scaling for fp16 training: the loss is multiplied by the scale
// before backward so that small gradients survive fp16; a step whose
// gradients overflow (inf or NaN) is skipped and the scale backs off; after
// `growth_interval` clean steps in a row it grows again.

#include <cstdint>

namespace ferry {

struct LossScalerOptions {
  // Default 2^16.
  double initial_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  // Clean steps before the scale grows. Default 1000.
  int64_t growth_interval = 1000;
  double min_scale = 1.0;
  double max_scale = 4294967296.0;  // 2^32
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // Steps skipped so far.
  int64_t skipped_steps() const { return skipped_; }

  // After a step: whether its gradients overflowed (and it was skipped).
  void Update(bool overflow);

  // Its whole state as text, and back (for checkpoints); false for text
  // State() did not make.
  std::string State() const;
  bool Restore(const std::string& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace ferry
