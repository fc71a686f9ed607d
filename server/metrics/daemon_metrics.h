#pragma once

// The daemon's Prometheus metrics. Only this package registers prometheus-cpp
// families; everything else reports through JobListener or these methods.

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "server/jobs/job_listener.h"

namespace ferry {

class DaemonMetrics : public JobListener {
 public:
  // `version`, `torch_version`: labels of ferry_build_info.
  DaemonMetrics(const std::string& version, const std::string& torch_version);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Capacity of a memory tier ("device", "host", "disk").
  void SetCapacity(const std::string& tier, uint64_t bytes);
  // The LibTorch version, once the worker probe has told it.
  void SetTorchVersion(const std::string& torch_version);

  void OnStateChange(ferry::v1::JobState from, ferry::v1::JobState to) override;
  void OnProgress(const ferry::v1::Progress& progress, uint64_t new_tokens) override;
  void OnPlacement(const ferry::v1::MemoryPlacement& placement) override;
  void OnRunning(const ferry::v1::Job& job) override;
  void OnCheckpoint(const ferry::v1::CheckpointInfo& checkpoint) override;
  void OnCheckpointFailed(uint64_t step) override;

  // A call the bearer-token check refused: `method` of ferry.v1.Ferry, `code`
  // "UNAUTHENTICATED" or "PERMISSION_DENIED".
  void OnCallRefused(const std::string& method, const std::string& code);

 private:
  prometheus::Gauge& MemoryGauge(const std::string& tier, const std::string& kind);

  std::shared_ptr<prometheus::Registry> registry_;
  std::string version_;
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Counter>& jobs_finished_;
  prometheus::Histogram& step_duration_;
  prometheus::Counter& steps_;
  prometheus::Counter& tokens_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& eval_loss_;
  prometheus::Gauge& learning_rate_;
  prometheus::Gauge& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& memory_;
  prometheus::Family<prometheus::Gauge>& rank_memory_;
  uint32_t ranks_seen_ = 0;  // ranks with rank_memory_ series
  prometheus::Family<prometheus::Gauge>& capacity_;
  prometheus::Counter& to_device_;
  prometheus::Counter& to_host_;
  prometheus::Counter& to_disk_;
  prometheus::Counter& from_disk_;
  prometheus::Counter& disk_wait_;
  prometheus::Counter& evictions_;
  prometheus::Counter& prefetch_hits_;
  prometheus::Counter& prefetch_misses_;
  prometheus::Family<prometheus::Gauge>& chunks_;
  prometheus::Gauge& prediction_error_;
  prometheus::Gauge& warmup_;
  prometheus::Gauge& steady_;
  prometheus::Gauge& recomputed_blocks_;
  prometheus::Gauge& loss_scale_;
  prometheus::Counter& skipped_steps_;
  prometheus::Gauge& step_;
  prometheus::Gauge& last_progress_time_;
  prometheus::Gauge& model_blocks_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Family<prometheus::Histogram>& checkpoint_duration_;
  prometheus::Gauge& last_checkpoint_time_;
  prometheus::Gauge& last_checkpoint_step_;
  prometheus::Gauge& last_checkpoint_bytes_;
  prometheus::Family<prometheus::Counter>& refused_calls_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Gauge* build_info_series_ = nullptr;
};

}  // namespace ferry
