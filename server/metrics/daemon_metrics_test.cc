#include "server/metrics/daemon_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

namespace ferry {
namespace {

std::string Scrape(const DaemonMetrics& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(DaemonMetricsTest, JobStatesAreCountedAcrossTransitions) {
  DaemonMetrics metrics("1.2.3", "1.13.1");
  metrics.OnStateChange(ferry::v1::JOB_STATE_UNSPECIFIED, ferry::v1::JOB_STATE_PENDING);
  metrics.OnStateChange(ferry::v1::JOB_STATE_UNSPECIFIED, ferry::v1::JOB_STATE_PENDING);
  metrics.OnStateChange(ferry::v1::JOB_STATE_PENDING, ferry::v1::JOB_STATE_RUNNING);
  metrics.OnStateChange(ferry::v1::JOB_STATE_RUNNING, ferry::v1::JOB_STATE_SUCCEEDED);
  const std::string text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_jobs{state=\"pending\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_jobs{state=\"running\"} 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_jobs{state=\"succeeded\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_jobs_finished_total{state=\"succeeded\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_build_info{torch_version=\"1.13.1\",version=\"1.2.3\"} 1")) << text;
}

TEST(DaemonMetricsTest, ProgressFeedsStepTokensLossAndMemory) {
  DaemonMetrics metrics("v", "t");
  ferry::v1::Progress p;
  p.set_step_seconds(0.2);
  p.set_loss(2.5);
  ferry::v1::MemoryUsage* m = p.add_memory();
  m->set_tier("host");
  m->set_kind("param");
  m->set_bytes(4096);
  ferry::v1::MemoryUsage* c = p.add_capacity();
  c->set_tier("host");
  c->set_bytes(1 << 20);
  p.set_memory_phase("steady");
  p.set_bytes_host_to_device(300);
  p.set_bytes_device_to_host(200);
  p.set_evictions(2);
  p.set_prefetch_hits(3);
  p.set_prefetch_misses(1);
  p.set_device_chunks(5);
  p.set_host_chunks(7);
  p.set_prediction_error(0.25);
  p.add_recomputed_blocks(0);
  p.add_recomputed_blocks(3);
  p.set_loss_scale(1024);
  p.set_skipped(true);
  // The disk tier: optimizer states in chunk files, read and written once a
  // step, and the part of the step spent waiting for them.
  ferry::v1::MemoryUsage* d = p.add_memory();
  d->set_tier("disk");
  d->set_kind("optimizer");
  d->set_bytes(8192);
  ferry::v1::MemoryUsage* dc = p.add_capacity();
  dc->set_tier("disk");
  dc->set_bytes(1 << 30);
  p.set_bytes_host_to_disk(8192);
  p.set_bytes_disk_to_host(4096);
  p.set_disk_chunks(2);
  p.mutable_step_times()->set_disk_seconds(0.125);
  metrics.OnProgress(p, 1000);
  p.mutable_eval()->set_loss(2.75);
  metrics.OnProgress(p, 24);
  const std::string text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_eval_loss 2.75")) << text;
  EXPECT_TRUE(Has(text, "ferry_tokens_total 1024")) << text;
  EXPECT_TRUE(Has(text, "ferry_steps_total 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_loss 2.5")) << text;
  EXPECT_TRUE(Has(text, "ferry_step_duration_seconds_count 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_step_duration_seconds_bucket{le=\"0.25\"} 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_bytes{kind=\"param\",tier=\"host\"} 4096")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_capacity_bytes{tier=\"host\"} 1048576")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_transferred_bytes_total{direction=\"host_to_device\"} 600")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_transferred_bytes_total{direction=\"device_to_host\"} 400")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_evictions_total 4")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_prefetches_total{result=\"hit\"} 6")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_chunks{tier=\"host\"} 7")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_prediction_error_ratio 0.25")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_phase{phase=\"steady\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_recomputed_blocks 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_loss_scale 1024")) << text;
  EXPECT_TRUE(Has(text, "ferry_skipped_steps_total 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_bytes{kind=\"optimizer\",tier=\"disk\"} 8192")) << text;
  EXPECT_FALSE(Has(text, "kind=\"activation\",tier=\"disk\"")) << "the disk holds model data only";
  EXPECT_TRUE(Has(text, "ferry_memory_capacity_bytes{tier=\"disk\"} 1073741824")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_transferred_bytes_total{direction=\"host_to_disk\"} 16384")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_transferred_bytes_total{direction=\"disk_to_host\"} 8192")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_disk_wait_seconds_total 0.25")) << text;
  EXPECT_TRUE(Has(text, "ferry_memory_chunks{tier=\"disk\"} 2")) << text;

  // Each rank's shard, by rank.
  for (uint32_t rank : {0u, 1u}) {
    ferry::v1::MemoryPlacement placement;
    placement.set_rank(rank);
    placement.set_world_size(2);
    for (const char* kind : {"param", "optimizer"}) {
      ferry::v1::MemoryUsage* u = placement.add_totals();
      u->set_tier("device");
      u->set_kind(kind);
      u->set_bytes(100 * (rank + 1));
    }
    ferry::v1::MemoryUsage* u = placement.add_totals();
    u->set_tier("disk");
    u->set_kind("optimizer");
    u->set_bytes(1000);
    metrics.OnPlacement(placement);
  }
  const std::string ranked = Scrape(metrics);
  EXPECT_TRUE(Has(ranked, "ferry_rank_memory_bytes{rank=\"1\",tier=\"device\"} 400")) << ranked;
  EXPECT_TRUE(Has(ranked, "ferry_rank_memory_bytes{rank=\"0\",tier=\"host\"} 0")) << ranked;
  EXPECT_TRUE(Has(ranked, "ferry_rank_memory_bytes{rank=\"0\",tier=\"disk\"} 1000")) << ranked;

  metrics.OnStateChange(ferry::v1::JOB_STATE_RUNNING, ferry::v1::JOB_STATE_FAILED);
  EXPECT_TRUE(Has(Scrape(metrics), "ferry_memory_bytes{kind=\"param\",tier=\"host\"} 0"))
      << "memory gauges drop when the job ends";
  EXPECT_TRUE(Has(Scrape(metrics), "ferry_rank_memory_bytes{rank=\"1\",tier=\"device\"} 0"));
  EXPECT_TRUE(Has(Scrape(metrics), "ferry_memory_bytes{kind=\"optimizer\",tier=\"disk\"} 0"));
  EXPECT_TRUE(Has(Scrape(metrics), "ferry_memory_capacity_bytes{tier=\"disk\"} 0")) << "the job's budget goes with it";
  EXPECT_TRUE(Has(Scrape(metrics), "ferry_rank_memory_bytes{rank=\"0\",tier=\"disk\"} 0"));
}

TEST(DaemonMetricsTest, RefusedCallsByMethodAndCode) {
  DaemonMetrics metrics("v", "t");
  metrics.OnCallRefused("SubmitJob", "PERMISSION_DENIED");
  metrics.OnCallRefused("SubmitJob", "PERMISSION_DENIED");
  metrics.OnCallRefused("GetJob", "UNAUTHENTICATED");
  const std::string text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_rpc_refused_total{code=\"PERMISSION_DENIED\",method=\"SubmitJob\"} 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"GetJob\"} 1")) << text;
}

TEST(DaemonMetricsTest, CheckpointsProgressTimeAndModelBlocks) {
  DaemonMetrics metrics("v", "t");
  std::string text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_checkpoints_total{result=\"written\"} 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_checkpoints_total{result=\"failed\"} 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_last_checkpoint_timestamp_seconds 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_last_progress_timestamp_seconds 0")) << text;

  ferry::v1::Job job;
  job.mutable_spec()->mutable_model()->set_layers(6);
  job.mutable_progress()->set_step(40);  // a resumed job
  metrics.OnRunning(job);
  metrics.OnStateChange(ferry::v1::JOB_STATE_PENDING, ferry::v1::JOB_STATE_RUNNING);
  text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_model_blocks 6")) << text;
  EXPECT_TRUE(Has(text, "ferry_step 40")) << text;
  EXPECT_FALSE(Has(text, "ferry_last_progress_timestamp_seconds 0\n")) << "a starting job counts as progress";

  ferry::v1::Progress p;
  p.set_step(41);
  metrics.OnProgress(p, 0);
  ferry::v1::CheckpointInfo checkpoint;
  checkpoint.set_step(41);
  checkpoint.set_blocking_seconds(0.02);
  checkpoint.set_total_seconds(0.7);
  checkpoint.set_bytes(123456);
  checkpoint.mutable_time()->set_seconds(1700000000);
  metrics.OnCheckpoint(checkpoint);
  metrics.OnCheckpointFailed(42);
  metrics.OnCheckpointFailed(43);
  text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_step 41")) << text;
  EXPECT_TRUE(Has(text, "ferry_checkpoints_total{result=\"written\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_checkpoints_total{result=\"failed\"} 2")) << text;
  EXPECT_TRUE(Has(text, "ferry_checkpoint_duration_seconds_bucket{part=\"blocking\",le=\"0.05\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_checkpoint_duration_seconds_bucket{part=\"total\",le=\"0.5\"} 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_checkpoint_duration_seconds_bucket{part=\"total\",le=\"1\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ferry_last_checkpoint_timestamp_seconds 1700000000")) << text;
  EXPECT_TRUE(Has(text, "ferry_last_checkpoint_step 41")) << text;
  EXPECT_TRUE(Has(text, "ferry_last_checkpoint_size_bytes 123456")) << text;

  metrics.OnStateChange(ferry::v1::JOB_STATE_RUNNING, ferry::v1::JOB_STATE_SUCCEEDED);
  text = Scrape(metrics);
  EXPECT_TRUE(Has(text, "ferry_model_blocks 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_step 0")) << text;
  EXPECT_TRUE(Has(text, "ferry_last_checkpoint_step 41")) << "kept after the job ends";
}

}  // namespace
}  // namespace ferry
