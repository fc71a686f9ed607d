#include "server/api/ferry_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/jobs/job_runner.h"

namespace ferry {
namespace {

using ferry::v1::JobEvent;
using ferry::v1::JobState;

// Reports `train.steps` steps, one every `step_millis`, honouring stops.
class FakeExecutor : public JobExecutor {
 public:
  RunOutcome Run(const std::string&, const ferry::v1::JobSpec& spec, const StopSignal& stop,
                 RunListener* listener) override {
    listener->OnStarted("fake");
    listener->OnLog(ferry::v1::SEVERITY_INFO, "hello from the fake worker");
    for (uint64_t step = 1; step <= spec.train().steps(); ++step) {
      if (stop.WaitFor(absl::Milliseconds(step_millis.load()))) {
        return {ferry::v1::JOB_STATE_CANCELLED, stop.reason()};
      }
      ferry::v1::Progress p;
      p.set_step(step);
      p.set_total_steps(spec.train().steps());
      p.set_loss(5.0 / double(step));
      p.set_tokens(step * 64);
      listener->OnProgress(p);
      ferry::v1::MemoryPlacement placement;
      placement.set_step(step);
      placement.set_policy("auto");
      placement.add_chunks()->set_id("p0");
      listener->OnPlacement(placement);
      steps_reported++;
    }
    return {ferry::v1::JOB_STATE_SUCCEEDED, ""};
  }
  std::atomic<int> step_millis{1};
  std::atomic<int> steps_reported{0};
};

class FerryServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(JobRegistryOptions registry_options, absl::Duration heartbeat = absl::Seconds(5)) {
    registry_ = std::make_unique<JobRegistry>(registry_options, nullptr);
    FerryServiceOptions options;
    options.heartbeat_interval = heartbeat;
    options.machine.host_memory_bytes = 16ull << 30;
    service_ = std::make_unique<FerryService>(registry_.get(), options);
    ferry::v1::DaemonInfo info;
    info.set_version("test");
    service_->SetReady(info);
    runner_ = std::make_unique<JobRunner>(registry_.get(), &executor_);
    runner_->Start();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    stub_ = ferry::v1::Ferry::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override { Stop(); }

  void Stop() {
    if (!server_) return;
    registry_->BeginDrain("test over");
    service_->BeginShutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    runner_->Join();
    server_.reset();
  }

  static ferry::v1::SubmitJobRequest Request(uint64_t steps, const std::string& request_id = "") {
    ferry::v1::SubmitJobRequest r;
    r.mutable_spec()->set_name("t");
    r.mutable_spec()->mutable_data()->mutable_synthetic();
    r.mutable_spec()->mutable_train()->set_steps(steps);
    r.set_request_id(request_id);
    return r;
  }

  grpc::Status Submit(const ferry::v1::SubmitJobRequest& r, ferry::v1::Job* job) {
    grpc::ClientContext ctx;
    return stub_->SubmitJob(&ctx, r, job);
  }

  ferry::v1::Job Get(const std::string& id) {
    grpc::ClientContext ctx;
    ferry::v1::GetJobRequest r;
    r.set_job_id(id);
    ferry::v1::Job job;
    EXPECT_TRUE(stub_->GetJob(&ctx, r, &job).ok());
    return job;
  }

  bool WaitForState(const std::string& id, JobState state) {
    for (int i = 0; i < 1000; ++i) {
      if (Get(id).state() == state) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // Reads a whole watch stream.
  grpc::Status Watch(const std::string& id, uint64_t after_seq, std::vector<JobEvent>* events,
                     int stop_after = -1) {
    grpc::ClientContext ctx;
    ferry::v1::WatchJobRequest r;
    r.set_job_id(id);
    r.set_after_seq(after_seq);
    auto reader = stub_->WatchJob(&ctx, r);
    JobEvent e;
    while (reader->Read(&e)) {
      events->push_back(e);
      if (stop_after >= 0 && static_cast<int>(events->size()) >= stop_after) {
        ctx.TryCancel();
        break;
      }
    }
    return reader->Finish();
  }

  FakeExecutor executor_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<FerryService> service_;
  std::unique_ptr<JobRunner> runner_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ferry::v1::Ferry::Stub> stub_;
};

TEST_F(FerryServiceTest, SubmitReturnsPendingWithTheResolvedSpecAndRunsIt) {
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(3), &job).ok());
  EXPECT_EQ(job.state(), ferry::v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.spec().model().preset(), "gpt2-tiny");
  EXPECT_EQ(job.spec().model().layers(), 2u);
  ASSERT_TRUE(WaitForState(job.id(), ferry::v1::JOB_STATE_SUCCEEDED));
  ferry::v1::Job done = Get(job.id());
  EXPECT_EQ(done.progress().step(), 3u);
  EXPECT_DOUBLE_EQ(done.progress().loss(), 5.0 / 3);
  EXPECT_DOUBLE_EQ(done.initial_loss(), 5.0);
  EXPECT_TRUE(done.has_start_time());
  EXPECT_TRUE(done.has_end_time());
}

TEST_F(FerryServiceTest, BadInputGetsTheRightCodeAndNamesTheField) {
  ferry::v1::Job job;
  ferry::v1::SubmitJobRequest bad = Request(3);
  bad.mutable_spec()->mutable_model()->set_hidden(100);
  bad.mutable_spec()->mutable_model()->set_heads(3);
  grpc::Status s = Submit(bad, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("model.hidden"), std::string::npos) << s.error_message();

  ferry::v1::SubmitJobRequest missing = Request(3);
  missing.mutable_spec()->mutable_data()->set_path("/nonexistent/tokens.bin");
  s = Submit(missing, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("data.path"), std::string::npos);

  ferry::v1::SubmitJobRequest huge = Request(3);
  huge.mutable_spec()->mutable_model()->set_preset("gpt2-xl");
  huge.mutable_spec()->mutable_model()->set_layers(1000);
  s = Submit(huge, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("choose a smaller model"), std::string::npos) << s.error_message();

  grpc::ClientContext ctx;
  ferry::v1::GetJobRequest get;
  get.set_job_id("j-00000000");
  s = stub_->GetJob(&ctx, get, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext ctx2;
  get.set_job_id("");
  s = stub_->GetJob(&ctx2, get, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("job_id"), std::string::npos);
}

TEST_F(FerryServiceTest, RequestIdIsIdempotent) {
  ferry::v1::Job a, b, c;
  ASSERT_TRUE(Submit(Request(2, "abc"), &a).ok());
  ASSERT_TRUE(Submit(Request(2, "abc"), &b).ok());
  EXPECT_EQ(a.id(), b.id());
  grpc::Status s = Submit(Request(9, "abc"), &c);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_NE(s.error_message().find("request_id"), std::string::npos);
}

TEST_F(FerryServiceTest, CancelAFinishedJobIsFailedPrecondition) {
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(1), &job).ok());
  ASSERT_TRUE(WaitForState(job.id(), ferry::v1::JOB_STATE_SUCCEEDED));
  grpc::ClientContext ctx;
  ferry::v1::CancelJobRequest r;
  r.set_job_id(job.id());
  ferry::v1::Job out;
  grpc::Status s = stub_->CancelJob(&ctx, r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(FerryServiceTest, CancelARunningJobStopsItWithoutDisturbingOthers) {
  executor_.step_millis = 20;
  ferry::v1::Job running, queued;
  ASSERT_TRUE(Submit(Request(100000), &running).ok());
  ASSERT_TRUE(Submit(Request(3), &queued).ok());
  ASSERT_TRUE(WaitForState(running.id(), ferry::v1::JOB_STATE_RUNNING));
  grpc::ClientContext ctx;
  ferry::v1::CancelJobRequest r;
  r.set_job_id(running.id());
  ferry::v1::Job out;
  ASSERT_TRUE(stub_->CancelJob(&ctx, r, &out).ok());
  EXPECT_TRUE(out.cancel_requested() || out.state() == ferry::v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(WaitForState(running.id(), ferry::v1::JOB_STATE_CANCELLED));
  executor_.step_millis = 1;
  EXPECT_TRUE(WaitForState(queued.id(), ferry::v1::JOB_STATE_SUCCEEDED));
}

TEST_F(FerryServiceTest, ListPagesAndFilters) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ferry::v1::Job job;
    ASSERT_TRUE(Submit(Request(1), &job).ok());
    ids.push_back(job.id());
  }
  for (const std::string& id : ids) ASSERT_TRUE(WaitForState(id, ferry::v1::JOB_STATE_SUCCEEDED));
  std::vector<std::string> seen;
  std::string token;
  do {
    grpc::ClientContext ctx;
    ferry::v1::ListJobsRequest r;
    r.set_page_size(2);
    r.set_page_token(token);
    ferry::v1::ListJobsResponse page;
    ASSERT_TRUE(stub_->ListJobs(&ctx, r, &page).ok());
    EXPECT_LE(page.jobs_size(), 2);
    for (const auto& j : page.jobs()) seen.push_back(j.id());
    token = page.next_page_token();
  } while (!token.empty());
  EXPECT_EQ(seen, ids);

  grpc::ClientContext ctx;
  ferry::v1::ListJobsRequest r;
  r.add_states(ferry::v1::JOB_STATE_FAILED);
  ferry::v1::ListJobsResponse page;
  ASSERT_TRUE(stub_->ListJobs(&ctx, r, &page).ok());
  EXPECT_EQ(page.jobs_size(), 0);

  grpc::ClientContext bad_ctx;
  r.set_page_token("not-a-token");
  EXPECT_EQ(stub_->ListJobs(&bad_ctx, r, &page).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(FerryServiceTest, WatchStartsWithASnapshotAndEndsWhenTheJobDoes) {
  executor_.step_millis = 5;
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(20), &job).ok());
  std::vector<JobEvent> events;
  ASSERT_TRUE(Watch(job.id(), 0, &events).ok());
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events[0].has_snapshot());
  EXPECT_EQ(events[0].snapshot().id(), job.id());
  EXPECT_EQ(events.back().state_change().to(), ferry::v1::JOB_STATE_SUCCEEDED);
  uint64_t previous = events[0].seq();
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), previous + 1) << "no gaps, no repeats";
    previous = events[i].seq();
  }
  // Every step after the snapshot is there.
  uint64_t last_step = events[0].snapshot().progress().step();
  for (const JobEvent& e : events) {
    if (e.has_progress()) {
      EXPECT_EQ(e.progress().step(), last_step + 1);
      last_step = e.progress().step();
    }
  }
  EXPECT_EQ(last_step, 20u);
}

TEST_F(FerryServiceTest, AReconnectingWatcherMissesNothing) {
  executor_.step_millis = 5;
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(30), &job).ok());
  std::vector<JobEvent> first;
  Watch(job.id(), 0, &first, /*stop_after=*/5);
  ASSERT_EQ(first.size(), 5u);
  absl::SleepFor(absl::Milliseconds(50));  // events keep coming while disconnected
  std::vector<JobEvent> second;
  ASSERT_TRUE(Watch(job.id(), first.back().seq(), &second).ok());
  ASSERT_GE(second.size(), 2u);
  EXPECT_TRUE(second[0].has_snapshot());
  EXPECT_EQ(second[1].seq(), first.back().seq() + 1) << "resumes right after the last seen event";
  for (size_t i = 2; i < second.size(); ++i) EXPECT_EQ(second[i].seq(), second[i - 1].seq() + 1);
  EXPECT_EQ(second.back().state_change().to(), ferry::v1::JOB_STATE_SUCCEEDED);
}

TEST_F(FerryServiceTest, WatchingDroppedEventsIsOutOfRange) {
  Stop();
  JobRegistryOptions small;
  small.event_buffer_events = 4;
  Start(small);
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(20), &job).ok());
  ASSERT_TRUE(WaitForState(job.id(), ferry::v1::JOB_STATE_SUCCEEDED));
  std::vector<JobEvent> events;
  grpc::Status s = Watch(job.id(), 1, &events);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find("after_seq=0"), std::string::npos);
  events.clear();
  EXPECT_TRUE(Watch(job.id(), 0, &events).ok()) << "a fresh watch still works";
  EXPECT_EQ(events.size(), 1u) << "just the snapshot of a finished job";
  EXPECT_EQ(events[0].snapshot().state(), ferry::v1::JOB_STATE_SUCCEEDED);
}

TEST_F(FerryServiceTest, IdleWatchersGetHeartbeats) {
  Stop();
  Start({}, absl::Milliseconds(50));
  executor_.step_millis = 400;
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(2), &job).ok());
  std::vector<JobEvent> events;
  ASSERT_TRUE(Watch(job.id(), 0, &events).ok());
  int heartbeats = 0;
  for (const JobEvent& e : events) heartbeats += e.has_heartbeat();
  EXPECT_GE(heartbeats, 3);
}

TEST_F(FerryServiceTest, ManyWatchersAndAStalledOneDoNotSlowTraining) {
  executor_.step_millis = 2;
  ferry::v1::Job job;
  ASSERT_TRUE(Submit(Request(200), &job).ok());
  // A watcher that reads its snapshot and then stops reading.
  grpc::ClientContext stalled_ctx;
  ferry::v1::WatchJobRequest r;
  r.set_job_id(job.id());
  auto stalled = stub_->WatchJob(&stalled_ctx, r);
  JobEvent e;
  ASSERT_TRUE(stalled->Read(&e));

  std::vector<std::thread> watchers;
  std::atomic<int> complete{0};
  for (int i = 0; i < 20; ++i) {
    watchers.emplace_back([&] {
      std::vector<JobEvent> events;
      if (Watch(job.id(), 0, &events).ok() &&
          events.back().state_change().to() == ferry::v1::JOB_STATE_SUCCEEDED) {
        complete++;
      }
    });
  }
  ASSERT_TRUE(WaitForState(job.id(), ferry::v1::JOB_STATE_SUCCEEDED));
  for (auto& t : watchers) t.join();
  EXPECT_EQ(complete, 20);
  EXPECT_EQ(executor_.steps_reported, 200);
  stalled_ctx.TryCancel();
}

TEST_F(FerryServiceTest, MemoryPlacementIsTheLatestStepsAndNeedsAStepFirst) {
  executor_.step_millis = 20;
  ferry::v1::Job running, queued;
  ASSERT_TRUE(Submit(Request(100000), &running).ok());
  ASSERT_TRUE(Submit(Request(3), &queued).ok());
  auto placement = [&](const std::string& id, ferry::v1::MemoryPlacement* out) {
    grpc::ClientContext ctx;
    ferry::v1::GetMemoryPlacementRequest r;
    r.set_job_id(id);
    return stub_->GetMemoryPlacement(&ctx, r, out);
  };
  ferry::v1::MemoryPlacement p;
  grpc::Status s = placement(queued.id(), &p);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("pending"), std::string::npos) << s.error_message();
  EXPECT_EQ(placement("j-00000000", &p).error_code(), grpc::StatusCode::NOT_FOUND);
  for (int i = 0; i < 200 && !placement(running.id(), &p).ok(); ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(placement(running.id(), &p).ok());
  EXPECT_EQ(p.job_id(), running.id());
  EXPECT_EQ(p.chunks(0).id(), "p0");
  const uint64_t first = p.step();
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(placement(running.id(), &p).ok());
  EXPECT_GT(p.step(), first) << "each step replaces the last";
}

TEST_F(FerryServiceTest, NothingAnswersBeforeReady) {
  Stop();
  registry_ = std::make_unique<JobRegistry>(JobRegistryOptions{}, nullptr);
  FerryService starting(registry_.get(), {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&starting);
  auto server = builder.BuildAndStart();
  auto stub = ferry::v1::Ferry::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ferry::v1::Job job;
  EXPECT_EQ(stub->SubmitJob(&ctx, Request(1), &job).error_code(), grpc::StatusCode::UNAVAILABLE);
  server->Shutdown();
}

}  // namespace
}  // namespace ferry
