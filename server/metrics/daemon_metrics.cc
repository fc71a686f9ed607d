#include "server/metrics/daemon_metrics.h"

#include <algorithm>
#include <string>

#include "absl/time/clock.h"
#include "server/common/enum_names.h"
#include "server/common/proto_time.h"

namespace ferry {
namespace {

const char* const kTiers[] = {"device", "host", "disk"};
const char* const kKinds[] = {"param", "grad", "optimizer", "activation"};

// The disk tier holds model data only.
bool TierHasKind(const char* tier, const char* kind) {
  return std::string(tier) != "disk" || std::string(kind) != "activation";
}

double UnixSeconds(absl::Time t = absl::Now()) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

const prometheus::Histogram::BucketBoundaries kCheckpointBuckets = {0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1,
                                                                     2.5,   5,    10,   30,  60,   120, 300};

}  // namespace

DaemonMetrics::DaemonMetrics(const std::string& version, const std::string& torch_version)
    : registry_(std::make_shared<prometheus::Registry>()),
      version_(version),
      jobs_(prometheus::BuildGauge()
                .Name("ferry_jobs")
                .Help("Jobs known to the daemon, by state.")
                .Register(*registry_)),
      jobs_finished_(prometheus::BuildCounter()
                         .Name("ferry_jobs_finished_total")
                         .Help("Jobs that reached a final state, by that state.")
                         .Register(*registry_)),
      step_duration_(prometheus::BuildHistogram()
                         .Name("ferry_step_duration_seconds")
                         .Help("Wall time of one training step (forward, backward, optimizer).")
                         .Register(*registry_)
                         .Add({}, prometheus::Histogram::BucketBoundaries{
                                      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                      30, 60, 120})),
      steps_(prometheus::BuildCounter()
                 .Name("ferry_steps_total")
                 .Help("Training steps completed.")
                 .Register(*registry_)
                 .Add({})),
      tokens_(prometheus::BuildCounter()
                  .Name("ferry_tokens_total")
                  .Help("Training tokens processed.")
                  .Register(*registry_)
                  .Add({})),
      loss_(prometheus::BuildGauge()
                .Name("ferry_loss")
                .Help("Training loss of the latest step, in nats per token.")
                .Register(*registry_)
                .Add({})),
      eval_loss_(prometheus::BuildGauge()
                     .Name("ferry_eval_loss")
                     .Help("Loss on held-out data (data.eval) at the latest evaluation, in nats per token.")
                     .Register(*registry_)
                     .Add({})),
      learning_rate_(prometheus::BuildGauge()
                         .Name("ferry_learning_rate")
                         .Help("Learning rate of the latest step.")
                         .Register(*registry_)
                         .Add({})),
      tokens_per_second_(prometheus::BuildGauge()
                             .Name("ferry_tokens_per_second")
                             .Help("Throughput of the latest step.")
                             .Register(*registry_)
                             .Add({})),
      memory_(prometheus::BuildGauge()
                  .Name("ferry_memory_bytes")
                  .Help("Memory in use by the running job, by tier and kind of data.")
                  .Register(*registry_)),
      rank_memory_(prometheus::BuildGauge()
                       .Name("ferry_rank_memory_bytes")
                       .Help("Model data of each rank of the running job (its shard), by tier.")
                       .Register(*registry_)),
      capacity_(prometheus::BuildGauge()
                    .Name("ferry_memory_capacity_bytes")
                    .Help("Memory available, by tier.")
                    .Register(*registry_)),
      to_device_(prometheus::BuildCounter()
                     .Name("ferry_memory_transferred_bytes_total")
                     .Help("Model data moved between the memory tiers, by direction: host and device, host and disk.")
                     .Register(*registry_)
                     .Add({{"direction", "host_to_device"}})),
      to_host_(prometheus::BuildCounter()
                   .Name("ferry_memory_transferred_bytes_total")
                   .Help("Model data moved between the memory tiers, by direction: host and device, host and disk.")
                   .Register(*registry_)
                   .Add({{"direction", "device_to_host"}})),
      to_disk_(prometheus::BuildCounter()
                   .Name("ferry_memory_transferred_bytes_total")
                   .Help("Model data moved between the memory tiers, by direction: host and device, host and disk.")
                   .Register(*registry_)
                   .Add({{"direction", "host_to_disk"}})),
      from_disk_(prometheus::BuildCounter()
                     .Name("ferry_memory_transferred_bytes_total")
                     .Help("Model data moved between the memory tiers, by direction: host and device, host and disk.")
                     .Register(*registry_)
                     .Add({{"direction", "disk_to_host"}})),
      disk_wait_(prometheus::BuildCounter()
                     .Name("ferry_memory_disk_wait_seconds_total")
                     .Help("Seconds steps spent waiting for the disk tier (reads and writes not hidden behind "
                           "other chunks' updates).")
                     .Register(*registry_)
                     .Add({})),
      evictions_(prometheus::BuildCounter()
                     .Name("ferry_memory_evictions_total")
                     .Help("Chunks evicted from the device to make room.")
                     .Register(*registry_)
                     .Add({})),
      prefetch_hits_(prometheus::BuildCounter()
                         .Name("ferry_memory_prefetches_total")
                         .Help("Chunks a period needed: already prefetched (hit) or fetched on demand (miss).")
                         .Register(*registry_)
                         .Add({{"result", "hit"}})),
      prefetch_misses_(prometheus::BuildCounter()
                           .Name("ferry_memory_prefetches_total")
                           .Help("Chunks a period needed: already prefetched (hit) or fetched on demand (miss).")
                           .Register(*registry_)
                           .Add({{"result", "miss"}})),
      chunks_(prometheus::BuildGauge()
                  .Name("ferry_memory_chunks")
                  .Help("Chunks of the running job with data on the device, wholly on the host, and with "
                        "optimizer states on disk.")
                  .Register(*registry_)),
      prediction_error_(prometheus::BuildGauge()
                            .Name("ferry_memory_prediction_error_ratio")
                            .Help("Largest relative error of the predicted non-model memory in the latest step.")
                            .Register(*registry_)
                            .Add({})),
      warmup_(prometheus::BuildGauge()
                  .Name("ferry_memory_phase")
                  .Help("1 for the memory manager's phase in the latest step: warmup (tracing) or steady.")
                  .Register(*registry_)
                  .Add({{"phase", "warmup"}})),
      steady_(prometheus::BuildGauge()
                  .Name("ferry_memory_phase")
                  .Help("1 for the memory manager's phase in the latest step: warmup (tracing) or steady.")
                  .Register(*registry_)
                  .Add({{"phase", "steady"}})),
      recomputed_blocks_(prometheus::BuildGauge()
                             .Name("ferry_recomputed_blocks")
                             .Help("Transformer blocks that recomputed their activations in the latest step.")
                             .Register(*registry_)
                             .Add({})),
      loss_scale_(prometheus::BuildGauge()
                      .Name("ferry_loss_scale")
                      .Help("The loss scale of the latest step (1 unless training in fp16).")
                      .Register(*registry_)
                      .Add({})),
      skipped_steps_(prometheus::BuildCounter()
                         .Name("ferry_skipped_steps_total")
                         .Help("Steps skipped because their fp16 gradients overflowed.")
                         .Register(*registry_)
                         .Add({})),
      step_(prometheus::BuildGauge()
                .Name("ferry_step")
                .Help("Steps completed by the running job (its latest report).")
                .Register(*registry_)
                .Add({})),
      last_progress_time_(prometheus::BuildGauge()
                              .Name("ferry_last_progress_timestamp_seconds")
                              .Help("Unix time of the latest step reported, or of the running job's start.")
                              .Register(*registry_)
                              .Add({})),
      model_blocks_(prometheus::BuildGauge()
                        .Name("ferry_model_blocks")
                        .Help("Transformer blocks of the running job's model (for the share recomputed).")
                        .Register(*registry_)
                        .Add({})),
      checkpoints_(prometheus::BuildCounter()
                       .Name("ferry_checkpoints_total")
                       .Help("Checkpoints written completely, and checkpoint writes that failed (any rank).")
                       .Register(*registry_)),
      checkpoint_duration_(prometheus::BuildHistogram()
                               .Name("ferry_checkpoint_duration_seconds")
                               .Help("Time of each checkpoint written: training blocked (blocking) and in all "
                                     "(total: snapshot, write, fsync, rename).")
                               .Register(*registry_)),
      last_checkpoint_time_(prometheus::BuildGauge()
                                .Name("ferry_last_checkpoint_timestamp_seconds")
                                .Help("Unix time of the latest checkpoint written completely; 0 before the first.")
                                .Register(*registry_)
                                .Add({})),
      last_checkpoint_step_(prometheus::BuildGauge()
                                .Name("ferry_last_checkpoint_step")
                                .Help("Step of the latest checkpoint written completely.")
                                .Register(*registry_)
                                .Add({})),
      last_checkpoint_bytes_(prometheus::BuildGauge()
                                 .Name("ferry_last_checkpoint_size_bytes")
                                 .Help("Size of the latest checkpoint written completely (rank 0's).")
                                 .Register(*registry_)
                                 .Add({})),
      refused_calls_(prometheus::BuildCounter()
                         .Name("ferry_rpc_refused_total")
                         .Help("Calls refused by the bearer-token check, by method and gRPC code "
                               "(UNAUTHENTICATED: no or unknown token; PERMISSION_DENIED: role too low).")
                         .Register(*registry_)),
      build_info_(prometheus::BuildGauge()
                      .Name("ferry_build_info")
                      .Help("Always 1; labels give the daemon and LibTorch versions.")
                      .Register(*registry_)) {
  for (int s = ferry::v1::JOB_STATE_PENDING; s <= ferry::v1::JOB_STATE_CANCELLED; ++s) {
    const auto state = static_cast<ferry::v1::JobState>(s);
    jobs_.Add({{"state", StateName(state)}});
    if (IsTerminalState(state)) jobs_finished_.Add({{"state", StateName(state)}});
  }
  for (const char* tier : kTiers) {
    for (const char* kind : kKinds) {
      if (TierHasKind(tier, kind)) MemoryGauge(tier, kind);
    }
    chunks_.Add({{"tier", tier}});
  }
  // The disk tier's capacity is the running job's budget, where it has one.
  SetCapacity("disk", 0);
  for (const char* result : {"written", "failed"}) checkpoints_.Add({{"result", result}});
  for (const char* part : {"blocking", "total"}) checkpoint_duration_.Add({{"part", part}}, kCheckpointBuckets);
  SetTorchVersion(torch_version);
}

prometheus::Gauge& DaemonMetrics::MemoryGauge(const std::string& tier, const std::string& kind) {
  return memory_.Add({{"tier", tier}, {"kind", kind}});
}

void DaemonMetrics::SetCapacity(const std::string& tier, uint64_t bytes) {
  capacity_.Add({{"tier", tier}}).Set(static_cast<double>(bytes));
}

void DaemonMetrics::SetTorchVersion(const std::string& torch_version) {
  if (build_info_series_ != nullptr) build_info_.Remove(build_info_series_);
  build_info_series_ = &build_info_.Add({{"version", version_}, {"torch_version", torch_version}});
  build_info_series_->Set(1);
}

void DaemonMetrics::OnStateChange(ferry::v1::JobState from, ferry::v1::JobState to) {
  // From UNSPECIFIED: a new job, or one read back from the job store at
  // start (already counted as finished by the daemon that ran it); to
  // UNSPECIFIED: a submit the store could not record.
  if (from != ferry::v1::JOB_STATE_UNSPECIFIED) jobs_.Add({{"state", StateName(from)}}).Decrement();
  if (to != ferry::v1::JOB_STATE_UNSPECIFIED) jobs_.Add({{"state", StateName(to)}}).Increment();
  if (IsTerminalState(to) && from != ferry::v1::JOB_STATE_UNSPECIFIED) {
    jobs_finished_.Add({{"state", StateName(to)}}).Increment();
  }
  if (from == ferry::v1::JOB_STATE_RUNNING) {
    // The job's memory is released with its worker.
    for (const char* tier : kTiers) {
      for (const char* kind : kKinds) {
        if (TierHasKind(tier, kind)) MemoryGauge(tier, kind).Set(0);
      }
      chunks_.Add({{"tier", tier}}).Set(0);
      for (uint32_t r = 0; r < ranks_seen_; ++r) rank_memory_.Add({{"rank", std::to_string(r)}, {"tier", tier}}).Set(0);
    }
    SetCapacity("disk", 0);
    tokens_per_second_.Set(0);
    warmup_.Set(0);
    steady_.Set(0);
    recomputed_blocks_.Set(0);
    step_.Set(0);
    model_blocks_.Set(0);
  }
}

void DaemonMetrics::OnRunning(const ferry::v1::Job& job) {
  // A run that has not reached its first step yet is not stalled.
  last_progress_time_.Set(UnixSeconds());
  step_.Set(static_cast<double>(job.progress().step()));
  model_blocks_.Set(job.spec().model().layers());
}

void DaemonMetrics::OnCheckpoint(const ferry::v1::CheckpointInfo& checkpoint) {
  checkpoints_.Add({{"result", "written"}}).Increment();
  checkpoint_duration_.Add({{"part", "blocking"}}, kCheckpointBuckets).Observe(checkpoint.blocking_seconds());
  checkpoint_duration_.Add({{"part", "total"}}, kCheckpointBuckets).Observe(checkpoint.total_seconds());
  last_checkpoint_time_.Set(UnixSeconds(checkpoint.has_time() ? FromProtoTime(checkpoint.time()) : absl::Now()));
  last_checkpoint_step_.Set(static_cast<double>(checkpoint.step()));
  last_checkpoint_bytes_.Set(static_cast<double>(checkpoint.bytes()));
}

void DaemonMetrics::OnCheckpointFailed(uint64_t step) {
  (void)step;
  checkpoints_.Add({{"result", "failed"}}).Increment();
}

void DaemonMetrics::OnCallRefused(const std::string& method, const std::string& code) {
  refused_calls_.Add({{"method", method}, {"code", code}}).Increment();
}

void DaemonMetrics::OnProgress(const ferry::v1::Progress& progress, uint64_t new_tokens) {
  step_duration_.Observe(progress.step_seconds());
  steps_.Increment();
  step_.Set(static_cast<double>(progress.step()));
  last_progress_time_.Set(UnixSeconds());
  tokens_.Increment(static_cast<double>(new_tokens));
  loss_.Set(progress.loss());
  if (progress.has_eval()) {
    eval_loss_.Set(progress.eval().loss());
  } else if (progress.has_initial_eval()) {
    eval_loss_.Set(progress.initial_eval().loss());
  }
  loss_scale_.Set(progress.loss_scale() > 0 ? progress.loss_scale() : 1.0);
  if (progress.skipped()) skipped_steps_.Increment();
  learning_rate_.Set(progress.lr());
  tokens_per_second_.Set(progress.tokens_per_second());
  for (const ferry::v1::MemoryUsage& m : progress.memory()) {
    MemoryGauge(m.tier(), m.kind()).Set(static_cast<double>(m.bytes()));
  }
  for (const ferry::v1::MemoryUsage& c : progress.capacity()) SetCapacity(c.tier(), c.bytes());
  if (progress.memory_phase().empty()) return;  // a run without the memory manager
  to_device_.Increment(static_cast<double>(progress.bytes_host_to_device()));
  to_host_.Increment(static_cast<double>(progress.bytes_device_to_host()));
  evictions_.Increment(progress.evictions());
  prefetch_hits_.Increment(progress.prefetch_hits());
  prefetch_misses_.Increment(progress.prefetch_misses());
  to_disk_.Increment(static_cast<double>(progress.bytes_host_to_disk()));
  from_disk_.Increment(static_cast<double>(progress.bytes_disk_to_host()));
  disk_wait_.Increment(progress.step_times().disk_seconds());
  chunks_.Add({{"tier", "device"}}).Set(progress.device_chunks());
  chunks_.Add({{"tier", "host"}}).Set(progress.host_chunks());
  chunks_.Add({{"tier", "disk"}}).Set(progress.disk_chunks());
  prediction_error_.Set(progress.prediction_error());
  recomputed_blocks_.Set(progress.recomputed_blocks_size());
  const bool warmup = progress.memory_phase() == "warmup";
  warmup_.Set(warmup ? 1 : 0);
  steady_.Set(warmup ? 0 : 1);
}

void DaemonMetrics::OnPlacement(const ferry::v1::MemoryPlacement& placement) {
  double bytes[3] = {0, 0, 0};
  for (const ferry::v1::MemoryUsage& u : placement.totals()) {
    for (int t = 0; t < 3; ++t) {
      if (u.tier() == kTiers[t]) bytes[t] += double(u.bytes());
    }
  }
  const std::string rank = std::to_string(placement.rank());
  for (int t = 0; t < 3; ++t) rank_memory_.Add({{"rank", rank}, {"tier", kTiers[t]}}).Set(bytes[t]);
  ranks_seen_ = std::max(ranks_seen_, placement.rank() + 1);
}

}  // namespace ferry
