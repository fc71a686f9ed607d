#include "engine/memory/period_tracer.h"

#include <algorithm>
#include <cmath>

namespace ferry {

PeriodTracer::PeriodTracer(const ChunkTable* table, const MemoryOptions& options)
    : table_(table), options_(options) {
  recompute_ = InitialRecompute();
  traced_recompute_ = recompute_;
  kept_activation_bytes_.assign(table_->stages.size(), 0);
  input_bytes_.assign(table_->stages.size(), 0);
}

std::vector<bool> PeriodTracer::InitialRecompute() const {
  std::vector<bool> r(table_->stages.size(), false);
  int block = 0;
  for (size_t s = 0; s < table_->stages.size(); ++s) {
    if (!table_->stages[s].recomputable) continue;
    switch (options_.recompute) {
      case MemoryOptions::Recompute::kNone:
        break;
      case MemoryOptions::Recompute::kAll:
      case MemoryOptions::Recompute::kAuto:  // the warm-up measures every block
        r[s] = true;
        break;
      case MemoryOptions::Recompute::kEvery:
        r[s] = block % std::max(1, options_.recompute_every) == 0;
        break;
    }
    ++block;
  }
  return r;
}

bool PeriodTracer::BeginStep(const std::vector<int64_t>& batch_shape) {
  const bool new_shape = batch_shape != traced_shape_;
  if (new_shape) {
    warmup_ = true;
    traced_shape_ = batch_shape;
    non_model_.assign(static_cast<size_t>(table_->cycle()), 0);
    recompute_ = InitialRecompute();
    traced_recompute_ = recompute_;
    kept_activation_bytes_.assign(table_->stages.size(), 0);
  }
  step_periods_.assign(static_cast<size_t>(table_->cycle()), Measure());
  return new_shape;
}

void PeriodTracer::StartMeasuring(uint64_t device_model_bytes) {
  period_model_bytes_ = device_model_bytes;
  if (current_period_ >= 0 && static_cast<size_t>(current_period_) < step_periods_.size()) {
    Measure& m = step_periods_[static_cast<size_t>(current_period_)];
    m.device_model_bytes = std::max(m.device_model_bytes, device_model_bytes);
  }
}

void PeriodTracer::EndPeriod(int period, uint64_t peak_allocated_bytes, StepMemoryStats* stats) {
  const uint64_t non_model = peak_allocated_bytes > period_model_bytes_ ? peak_allocated_bytes - period_model_bytes_ : 0;
  const size_t p = static_cast<size_t>(period);
  if (warmup_) {
    non_model_[p] = std::max(non_model_[p], non_model);
  } else {
    const double predicted = double(predicted_[p]);
    const double error = std::fabs(double(non_model) - predicted) / std::max(predicted, double(1 << 20));
    stats->prediction_error = std::max(stats->prediction_error, error);
    predicted_[p] = std::max(predicted_[p], non_model);
  }
  stats->peak_non_model_bytes = std::max(stats->peak_non_model_bytes, non_model);
  stats->peak_device_bytes = std::max(stats->peak_device_bytes, peak_allocated_bytes);
  if (p < step_periods_.size()) step_periods_[p].non_model_bytes = std::max(step_periods_[p].non_model_bytes, non_model);
  current_period_ = -1;
}

void PeriodTracer::CountEviction(int period) {
  if (period >= 0 && static_cast<size_t>(period) < step_periods_.size()) {
    ++step_periods_[static_cast<size_t>(period)].evictions;
  }
}

void PeriodTracer::CountFetch(bool prefetch) {
  if (current_period_ >= 0 && static_cast<size_t>(current_period_) < step_periods_.size()) {
    Measure& m = step_periods_[static_cast<size_t>(current_period_)];
    ++(prefetch ? m.prefetches : m.fetches);
  }
}

uint64_t PeriodTracer::Predicted(int period) const {
  return period >= 0 && period < static_cast<int>(predicted_.size()) ? predicted_[static_cast<size_t>(period)] : 0;
}

std::vector<int> PeriodTracer::RecomputedStages() const {
  std::vector<int> stages;
  for (size_t s = 0; s < recompute_.size(); ++s) {
    if (recompute_[s]) stages.push_back(static_cast<int>(s));
  }
  return stages;
}

void PeriodTracer::RecordInput(int stage, uint64_t bytes) { input_bytes_[static_cast<size_t>(stage)] = bytes; }

void PeriodTracer::RecordKept(int stage, uint64_t bytes) {
  uint64_t& recorded = kept_activation_bytes_[static_cast<size_t>(stage)];
  recorded = std::max(recorded, bytes);
}

uint64_t PeriodTracer::KeepCost(int stage) const {
  // Beyond the input, which a recomputing stage keeps anyway.
  const size_t i = static_cast<size_t>(stage);
  return kept_activation_bytes_[i] > input_bytes_[i] ? kept_activation_bytes_[i] - input_bytes_[i] : 0;
}

std::vector<uint64_t> PeriodTracer::TraceWith(const std::vector<bool>& recompute) const {
  std::vector<uint64_t> trace = non_model_;
  for (int s = 0; s < table_->stage_count(); ++s) {
    const size_t i = static_cast<size_t>(s);
    if (!traced_recompute_[i] || recompute[i]) continue;
    // Kept instead of recomputed: its activations stay from its forward to
    // its backward.
    const uint64_t extra = KeepCost(s);
    for (int p = table_->ForwardPeriod(s); p < table_->BackwardPeriod(s); ++p) trace[static_cast<size_t>(p)] += extra;
  }
  return trace;
}

void PeriodTracer::ChooseRecompute(const std::function<bool(const std::vector<uint64_t>& trace)>& fits) {
  if (options_.recompute == MemoryOptions::Recompute::kAuto) {
    std::vector<int> candidates;
    for (int s = 0; s < table_->stage_count(); ++s) {
      if (recompute_[static_cast<size_t>(s)]) candidates.push_back(s);
    }
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
      return KeepCost(a) != KeepCost(b) ? KeepCost(a) < KeepCost(b) : a > b;
    });
    std::vector<bool> chosen = recompute_;
    for (int s : candidates) {
      std::vector<bool> trial = chosen;
      trial[static_cast<size_t>(s)] = false;
      if (fits(TraceWith(trial))) chosen = trial;
    }
    recompute_ = chosen;
  }
  predicted_ = TraceWith(recompute_);
}

}  // namespace ferry
