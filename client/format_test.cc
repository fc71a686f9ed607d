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
                       "copying chunks 25%"),
            std::string::npos)
      << frame;
}

}  // namespace
}  // namespace ferry
