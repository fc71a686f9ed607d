#include "client/format.h"

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace ferry {
namespace {

TEST(FormatTest, ClockAndCounts) {
  EXPECT_EQ(FormatClock(7), "0:07");
  EXPECT_EQ(FormatClock(723), "12:03");
  EXPECT_EQ(FormatClock(3723), "1:02:03");
  EXPECT_EQ(FormatClock(-1), "-");
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(12400), "12.4k");
  EXPECT_EQ(FormatCount(3.1e6), "3.1M");
}

TEST(FormatTest, ProgressLineHasStepLossThroughputAndEta) {
  ferry::v1::Progress p;
  p.set_step(50);
  p.set_total_steps(200);
  p.set_loss(2.34567);
  p.set_tokens_per_second(12400);
  p.set_step_seconds(0.1);
  p.set_elapsed_seconds(5.0);
  EXPECT_EQ(ProgressLine(p), "step 50/200  loss 2.3457  12.4k tok/s  0.100 s/step  ETA 0:15");
  p.set_step(200);
  EXPECT_EQ(ProgressLine(p).find("ETA"), std::string::npos) << "no ETA once done";
  p.set_loss_scale(65536);
  p.set_skipped_steps(3);
  EXPECT_NE(ProgressLine(p).find("scale 65.5k  skipped 3"), std::string::npos) << ProgressLine(p);
  p.mutable_eval()->set_loss(2.5);
  p.mutable_eval()->set_perplexity(12.18);
  EXPECT_NE(ProgressLine(p).find("s/step  eval 2.5000 (ppl 12.18)  scale"), std::string::npos) << ProgressLine(p);
}

TEST(FormatTest, TableAlignsColumns) {
  ferry::v1::Job a;
  a.set_id("j-00000001");
  a.set_state(ferry::v1::JOB_STATE_RUNNING);
  a.mutable_spec()->set_name("tiny");
  a.mutable_progress()->set_step(3);
  a.mutable_progress()->set_total_steps(10);
  a.mutable_progress()->set_loss(1.5);
  const std::string table = JobTable({a}, absl::Now());
  EXPECT_EQ(table,
            "ID          NAME  STATE    STEP  LOSS    AGE\n"
            "j-00000001  tiny  running  3/10  1.5000  -\n");
}

TEST(FormatTest, MemoryPlacementShowsTiersChunksAndTrace) {
  ferry::v1::MemoryPlacement m;
  m.set_job_id("j-1");
  m.set_policy("auto");
  m.set_device("sim");
  m.set_phase("steady");
  m.set_step(9);
  m.set_device_capacity_bytes(100 << 20);
  m.set_device_limit_bytes(95 << 20);
  for (const char* kind : {"param", "grad", "optimizer"}) {
    ferry::v1::ChunkPlacement* c = m.add_chunks();
    c->set_kind(kind);
    c->set_chunk(0);
    c->set_tier(std::string(kind) == "grad" ? "none" : std::string(kind) == "param" ? "both" : "host");
    c->set_placement("pinned_params");
    c->set_state("hold");
    c->set_tensors(3);
    ferry::v1::MemoryUsage* u = m.add_totals();
    u->set_tier("device");
    u->set_kind(kind);
    u->set_bytes(std::string(kind) == "param" ? 50 << 20 : 0);
  }
  ferry::v1::PeriodTrace* t = m.add_trace();
  t->set_name("forward embed");
  t->set_non_model_bytes(1 << 20);
  const std::string text = MemoryPlacementText(m);
  EXPECT_NE(text.find("j-1  auto policy on sim, steady (step 9)"), std::string::npos) << text;
  EXPECT_NE(text.find("[####################....................]  50 MiB of 100 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("    0  PB G- OH  pinned_params"), std::string::npos) << text;
  EXPECT_NE(text.find("forward embed"), std::string::npos) << text;
}

TEST(FormatTest, MemoryPlacementShowsTheDiskTier) {
  ferry::v1::MemoryPlacement m;
  m.set_job_id("j-2");
  m.set_policy("auto");
  m.set_device("sim");
  m.set_phase("steady");
  m.set_device_capacity_bytes(100 << 20);
  m.set_host_budget_bytes(200 << 20);
  m.set_planned_host_bytes(150 << 20);
  m.set_disk_dir("/nvme/ferry-j-2/rank0");
  m.set_disk_budget_bytes(400 << 20);
  m.set_planned_disk_bytes(100 << 20);
  m.set_planned_disk_read_bytes(100 << 20);
  m.set_planned_disk_write_bytes(100 << 20);
  for (int chunk = 0; chunk < 2; ++chunk) {
    for (const char* kind : {"param", "grad", "optimizer"}) {
      ferry::v1::ChunkPlacement* c = m.add_chunks();
      c->set_kind(kind);
      c->set_chunk(chunk);
      const bool states = std::string(kind) == "optimizer";
      // Chunk 0's states live on disk; chunk 1's on disk too, but cached
      // on the device for its update there.
      c->set_tier(states ? (chunk == 0 ? "disk" : "device") : "host");
      c->set_home(states ? "disk" : "host");
      c->set_placement(chunk == 0 ? "streamed" : "device_homed");
      c->set_state("hold");
      c->set_tensors(2);
    }
  }
  ferry::v1::MemoryUsage* u = m.add_totals();
  u->set_tier("disk");
  u->set_kind("optimizer");
  u->set_bytes(100 << 20);
  u = m.add_totals();
  u->set_tier("host");
  u->set_kind("param");
  u->set_bytes(50 << 20);
  const std::string text = MemoryPlacementText(m);
  EXPECT_NE(text.find("host   [##########..............................]  50 MiB of 200 MiB (memory.host_budget); "
                      "planned peak 150 MiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("disk   [##########..............................]  100 MiB of 400 MiB (memory.disk_budget) in "
                      "/nvme/ferry-j-2/rank0\n         optimizer 100 MiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("and 100 MiB read from disk and 100 MiB written"), std::string::npos) << text;
  EXPECT_NE(text.find("D device, H host, S disk, B both"), std::string::npos) << text;
  EXPECT_NE(text.find("    0  PH GH OS  streamed"), std::string::npos) << text;
  EXPECT_NE(text.find("    1  PH GH OD  device_homed  hold             2 tensors; O's home on disk"), std::string::npos)
      << text;
  // No disk tier: no disk bar, no S in the legend.
  m.clear_disk_dir();
  m.mutable_totals()->DeleteSubrange(0, 1);
  EXPECT_EQ(MemoryPlacementText(m).find("disk   ["), std::string::npos);
  EXPECT_EQ(MemoryPlacementText(m).find("S disk"), std::string::npos);
}

TEST(FormatTest, JobDetailsShowTheDiskTier) {
  ferry::v1::Job job;
  job.set_id("j-3");
  job.mutable_spec()->mutable_memory()->set_disk_dir("/nvme");
  ferry::v1::Progress* p = job.mutable_progress();
  p->set_step(4);
  p->set_total_steps(10);
  ferry::v1::MemoryUsage* u = p->add_memory();
  u->set_tier("disk");
  u->set_kind("optimizer");
  u->set_bytes(3ull << 30);
  p->set_disk_model_bytes(3ull << 30);
  p->set_disk_chunks(12);
  p->set_bytes_disk_to_host(3ull << 30);
  p->set_bytes_host_to_disk(3ull << 30);
  p->mutable_step_times()->set_disk_seconds(1.25);
  const std::string text = JobDetails(job, absl::Now());
  EXPECT_NE(text.find("memory:      disk optimizer 3 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("disk:        3 GiB of gradients and optimizer states of 12 chunks in /nvme; last step 3 GiB read, 3 GiB "
                      "written, 1.25 s waiting"),
            std::string::npos)
      << text;
  p->set_disk_chunks(0);
  p->set_disk_model_bytes(0);
  EXPECT_EQ(JobDetails(job, absl::Now()).find("disk:"), std::string::npos);
}

TEST(FormatTest, JsonUsesProtoFieldNames) {
  ferry::v1::Job job;
  job.set_id("j-1");
  job.set_state(ferry::v1::JOB_STATE_SUCCEEDED);
  const std::string json = ToJson(job, false);
  EXPECT_NE(json.find("\"state\":\"JOB_STATE_SUCCEEDED\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"cancel_requested\":false"), std::string::npos) << json;
}

TEST(FormatTest, YamlCarriesTheSameFields) {
  ferry::v1::Job job;
  job.set_id("j-1");
  job.mutable_spec()->set_name("tiny: a \"quoted\" name");
  job.mutable_progress()->set_step(3);
  const std::string yaml = JsonToYaml(ToJson(job, true));
  EXPECT_NE(yaml.find("id: j-1\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  step: "), std::string::npos) << "block style, nested: " << yaml;
  EXPECT_EQ(yaml.find("{"), std::string::npos) << "no flow style: " << yaml;
  EXPECT_NE(yaml.find("tiny: a \\\"quoted\\\" name"), std::string::npos) << "quoted where needed: " << yaml;
  EXPECT_EQ(JsonToYaml("{\"a\": [1,"), "{\"a\": [1,") << "unparseable: returned as it was";
}

TEST(FormatTest, TopFrameShowsProgressMemoryMovesAndTime) {
  ferry::v1::Job job;
  job.set_id("j-1");
  job.set_state(ferry::v1::JOB_STATE_RUNNING);
  job.set_initial_loss(5.5);
  ferry::v1::Progress* p = job.mutable_progress();
  EXPECT_NE(TopFrame(job, nullptr, 100).find("waiting for the first step"), std::string::npos);
  p->set_step(50);
  p->set_total_steps(200);
  p->set_loss(2.25);
  p->set_elapsed_seconds(10);
  p->set_step_seconds(0.2);
  p->set_tokens_per_second(5000);
  p->set_bytes_host_to_device(3 << 20);
  p->set_evictions(4);
  auto usage = [](google::protobuf::RepeatedPtrField<ferry::v1::MemoryUsage>* f, const char* tier, const char* kind,
                  uint64_t bytes) {
    ferry::v1::MemoryUsage* u = f->Add();
    u->set_tier(tier);
    u->set_kind(kind);
    u->set_bytes(bytes);
  };
  usage(p->mutable_memory(), "device", "param", 25 << 20);
  usage(p->mutable_memory(), "device", "activation", 25 << 20);
  usage(p->mutable_memory(), "host", "optimizer", 10 << 20);
  usage(p->mutable_capacity(), "device", "", 100 << 20);
  usage(p->mutable_capacity(), "host", "", 1000 << 20);
  ferry::v1::StepTimes* t = p->mutable_step_times();
  t->set_data_seconds(0.02);
  t->set_forward_seconds(0.06);
  t->set_backward_seconds(0.1);
  t->set_optimizer_seconds(0.02);
  t->set_transfer_seconds(0.05);
  const std::string frame = TopFrame(job, nullptr, 80);  // bars of 30 cells
  EXPECT_NE(frame.find("j-1  RUNNING  step 50/200 (25%)  ETA 30s"), std::string::npos) << frame;
  EXPECT_NE(frame.find("loss 2.2500 (first 5.5000)"), std::string::npos) << frame;
  EXPECT_NE(frame.find("device [########+++++++...............]  25 MiB model + 25 MiB of 100 MiB"), std::string::npos)
      << frame;
  EXPECT_NE(frame.find("host->device 3 MiB"), std::string::npos) << frame;
  EXPECT_NE(frame.find("4 evictions"), std::string::npos) << frame;
  EXPECT_NE(frame.find("[dddfffffffffbbbbbbbbbbbbbbbooo]  data 10%, forward 30%, backward 50%, optimizer 10%; "
                       "copying chunks 25%\n"),
            std::string::npos)
      << frame;
  EXPECT_EQ(frame.find("disk"), std::string::npos) << "no disk tier, no disk figures: " << frame;
  EXPECT_EQ(frame.find("FLOP/s"), std::string::npos) << "no rate measured, none shown: " << frame;
  EXPECT_EQ(frame.find("eval"), std::string::npos) << "no eval data, no eval loss: " << frame;
  job.mutable_initial_eval()->set_loss(5.25);
  job.mutable_initial_eval()->set_perplexity(190.57);
  job.mutable_last_eval()->set_step(40);
  job.mutable_last_eval()->set_loss(2.5);
  job.mutable_last_eval()->set_perplexity(12.18);
  EXPECT_NE(TopFrame(job, nullptr, 80).find("eval loss 2.5000 (perplexity 12.18) at step 40, 5.2500 (190.57) before training\n"),
            std::string::npos)
      << TopFrame(job, nullptr, 80);
  EXPECT_NE(JobDetails(job, absl::Now()).find("eval:        2.5000 (perplexity 12.18) at step 40"), std::string::npos)
      << JobDetails(job, absl::Now());
  job.clear_initial_eval();
  job.clear_last_eval();

  // The achieved rate, beside the device's for the job's precision: bf16
  // where the device multiplies bf16 faster, fp32 otherwise.
  p->set_achieved_flops(45e9);
  ferry::v1::DaemonInfo info;
  ferry::v1::Device* cpu = info.add_devices();
  cpu->set_fp32_matmul_flops(180e9);
  cpu->set_bf16_matmul_flops(600e9);
  EXPECT_NE(TopFrame(job, nullptr, 80, &info)
                .find("compute 45.0 GFLOP/s (6 x parameters x tokens a second), 25% of the device's 180.0 GFLOP/s "
                      "matrix-product rate\n"),
            std::string::npos)
      << TopFrame(job, nullptr, 80, &info);
  job.mutable_spec()->mutable_train()->set_precision(ferry::v1::PRECISION_BF16);
  EXPECT_NE(TopFrame(job, nullptr, 80, &info).find("8% of the device's 600.0 GFLOP/s"), std::string::npos);
  cpu->set_bf16_matmul_flops(90e9);  // no bf16 arithmetic: its products compute in fp32
  EXPECT_NE(TopFrame(job, nullptr, 80, &info).find("25% of the device's 180.0 GFLOP/s"), std::string::npos);
  EXPECT_NE(TopFrame(job, nullptr, 80).find("compute 45.0 GFLOP/s (6 x parameters x tokens a second)\n"),
            std::string::npos);
  p->set_achieved_flops(0);

  // With the disk tier: its bar, its traffic, and the optimizer's wait for
  // it ('w', out of the optimizer's cells).
  usage(p->mutable_memory(), "disk", "optimizer", 30 << 20);
  usage(p->mutable_capacity(), "disk", "", 100 << 20);
  p->set_disk_chunks(3);
  p->set_bytes_host_to_disk(30 << 20);
  p->set_bytes_disk_to_host(30 << 20);
  p->set_peak_host_model_bytes(12 << 20);
  t->set_optimizer_seconds(0.04);
  t->set_backward_seconds(0.08);
  t->set_disk_seconds(0.03);
  const std::string disk = TopFrame(job, nullptr, 80);
  EXPECT_NE(disk.find("  disk   [#########.....................]  30 MiB model of 100 MiB, 3 chunks' gradients and optimizer states"),
            std::string::npos)
      << disk;
  EXPECT_NE(disk.find("10 MiB model of 1000 MiB (step's peak 12 MiB)"), std::string::npos) << disk;
  EXPECT_NE(disk.find("host->disk 30 MiB, disk->host 30 MiB this step"), std::string::npos) << disk;
  EXPECT_NE(disk.find("[dddfffffffffbbbbbbbbbbbboowwww]  data 10%, forward 30%, backward 40%, optimizer 20%; "
                      "copying chunks 25%, waiting for disk 15%\n"),
            std::string::npos)
      << disk;
}

}  // namespace
}  // namespace ferry
