#include "server/jobs/job_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"

#include "server/jobs/job_runner.h"

namespace ferry {
namespace {

using ferry::v1::Job;
using ferry::v1::JobSpec;
using ferry::v1::JobState;

JobSpec Spec(const std::string& name, uint64_t steps = 10) {
  JobSpec spec;
  spec.set_name(name);
  spec.mutable_train()->set_steps(steps);
  return spec;
}

class CountingListener : public JobListener {
 public:
  void OnStateChange(JobState from, JobState to) override {
    (void)from;
    ++changes[to];
  }
  void OnProgress(const ferry::v1::Progress&, uint64_t new_tokens) override { tokens += new_tokens; }
  std::map<JobState, int> changes;
  uint64_t tokens = 0;
};

TEST(JobRegistryTest, SubmitQueuesPendingJobsInOrder) {
  JobRegistry registry({}, nullptr);
  absl::StatusOr<Job> a = registry.Submit(Spec("a"), Spec("a"), "");
  absl::StatusOr<Job> b = registry.Submit(Spec("b"), Spec("b"), "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->state(), ferry::v1::JOB_STATE_PENDING);
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(a->id().rfind("j-", 0), 0u);
  EXPECT_TRUE(a->has_create_time());
  std::optional<RunnableJob> first = registry.TakeNext(absl::ZeroDuration());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->id, a->id()) << "FIFO";
  EXPECT_EQ(registry.Get(a->id())->state(), ferry::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(registry.TakeNext(absl::ZeroDuration())->id, b->id());
  EXPECT_FALSE(registry.TakeNext(absl::Milliseconds(1)).has_value());
}

TEST(JobRegistryTest, RequestIdMakesSubmitIdempotent) {
  JobRegistry registry({}, nullptr);
  absl::StatusOr<Job> first = registry.Submit(Spec("a"), Spec("a"), "req-1");
  absl::StatusOr<Job> again = registry.Submit(Spec("a"), Spec("a"), "req-1");
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(first->id(), again->id());
  EXPECT_EQ(registry.CountByState()[ferry::v1::JOB_STATE_PENDING], 1u);
  absl::StatusOr<Job> other = registry.Submit(Spec("b"), Spec("b"), "req-1");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(other.status().message().find(first->id()), std::string::npos);
}

TEST(JobRegistryTest, FullQueueIsResourceExhausted) {
  JobRegistryOptions options;
  options.max_queued_jobs = 2;
  JobRegistry registry(options, nullptr);
  ASSERT_TRUE(registry.Submit(Spec("a"), Spec("a"), "").ok());
  ASSERT_TRUE(registry.Submit(Spec("b"), Spec("b"), "").ok());
  EXPECT_EQ(registry.Submit(Spec("c"), Spec("c"), "").status().code(),
            absl::StatusCode::kResourceExhausted);
  registry.TakeNext(absl::ZeroDuration());
  EXPECT_TRUE(registry.Submit(Spec("c"), Spec("c"), "").ok()) << "a running job frees its slot";
}

TEST(JobRegistryTest, UnknownIdsAreNotFound) {
  JobRegistry registry({}, nullptr);
  EXPECT_EQ(registry.Get("j-nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Cancel("j-nope", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.StartWatch("j-nope", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST(JobRegistryTest, CancelPendingRunningAndFinished) {
  CountingListener listener;
  JobRegistry registry({}, &listener);
  const std::string pending = registry.Submit(Spec("p"), Spec("p"), "")->id();
  absl::StatusOr<Job> cancelled = registry.Cancel(pending, "by user");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), ferry::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->error(), "by user");
  EXPECT_FALSE(registry.TakeNext(absl::ZeroDuration()).has_value()) << "left the queue";

  const std::string running = registry.Submit(Spec("r"), Spec("r"), "")->id();
  std::optional<RunnableJob> job = registry.TakeNext(absl::ZeroDuration());
  ASSERT_TRUE(job.has_value());
  absl::StatusOr<Job> asked = registry.Cancel(running, "stop please");
  ASSERT_TRUE(asked.ok());
  EXPECT_EQ(asked->state(), ferry::v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(asked->cancel_requested());
  EXPECT_TRUE(job->stop->requested());
  EXPECT_EQ(job->stop->reason(), "stop please");
  registry.Finish(running, ferry::v1::JOB_STATE_CANCELLED, "stopped after step 3");

  absl::StatusOr<Job> twice = registry.Cancel(running, "");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.status().message().find("already ended (cancelled)"), std::string::npos);
  EXPECT_EQ(listener.changes[ferry::v1::JOB_STATE_CANCELLED], 2);
}

TEST(JobRegistryTest, ProgressUpdatesTheJobAndItsEvents) {
  CountingListener listener;
  JobRegistry registry({}, &listener);
  const std::string id = registry.Submit(Spec("a", 3), Spec("a", 3), "")->id();
  registry.TakeNext(absl::ZeroDuration());
  for (uint64_t step = 1; step <= 3; ++step) {
    ferry::v1::Progress p;
    p.set_step(step);
    p.set_total_steps(3);
    p.set_loss(10.0 / step);
    p.set_tokens(step * 100);
    registry.RecordProgress(id, p);
  }
  registry.Finish(id, ferry::v1::JOB_STATE_SUCCEEDED, "");
  Job job = *registry.Get(id);
  EXPECT_EQ(job.state(), ferry::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.progress().step(), 3u);
  EXPECT_DOUBLE_EQ(job.progress().loss(), 10.0 / 3);
  EXPECT_DOUBLE_EQ(job.initial_loss(), 10.0);
  EXPECT_TRUE(job.has_end_time());
  EXPECT_EQ(listener.tokens, 300u);

  std::unique_ptr<JobRegistry::Watch> watch = *registry.StartWatch(id, 0);
  std::vector<ferry::v1::JobEvent> events;
  ASSERT_TRUE(watch->events().ReadAfter(0, 100, &events).ok());
  // PENDING, RUNNING, 3 progress, SUCCEEDED.
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0].state_change().to(), ferry::v1::JOB_STATE_PENDING);
  EXPECT_EQ(events[1].state_change().to(), ferry::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(events[4].progress().step(), 3u);
  EXPECT_EQ(events[5].state_change().to(), ferry::v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(watch->events().closed());
  EXPECT_EQ(watch->snapshot_seq(), 6u);
  EXPECT_EQ(watch->snapshot().state(), ferry::v1::JOB_STATE_SUCCEEDED);
}

TEST(JobRegistryTest, ListPagesInSubmissionOrderAndFiltersByState) {
  JobRegistry registry({}, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(registry.Submit(Spec("j"), Spec("j"), "")->id());
  registry.TakeNext(absl::ZeroDuration());  // ids[0] runs

  absl::StatusOr<JobRegistry::Page> page = registry.List(2, "", {});
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs.size(), 2u);
  EXPECT_EQ(page->jobs[0].id(), ids[0]);
  EXPECT_EQ(page->jobs[1].id(), ids[1]);
  std::vector<std::string> seen;
  std::string token = page->next_page_token;
  while (!token.empty()) {
    page = registry.List(2, token, {});
    ASSERT_TRUE(page.ok());
    for (const Job& j : page->jobs) seen.push_back(j.id());
    token = page->next_page_token;
  }
  EXPECT_EQ(seen, (std::vector<std::string>{ids[2], ids[3], ids[4]}));

  page = registry.List(100, "", {ferry::v1::JOB_STATE_RUNNING});
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].id(), ids[0]);
  EXPECT_TRUE(page->next_page_token.empty());

  EXPECT_EQ(registry.List(2, "garbage!", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobRegistryTest, WatchRefusesSeqsItCannotServe) {
  JobRegistryOptions options;
  options.event_buffer_events = 3;
  options.max_watchers_per_job = 2;
  JobRegistry registry(options, nullptr);
  const std::string id = registry.Submit(Spec("a"), Spec("a"), "")->id();
  registry.TakeNext(absl::ZeroDuration());
  for (int i = 0; i < 5; ++i) registry.AppendLog(id, ferry::v1::SEVERITY_INFO, "line");
  // 7 events, buffer keeps 5..7.
  EXPECT_EQ(registry.StartWatch(id, 99).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(registry.StartWatch(id, 2).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<std::unique_ptr<JobRegistry::Watch>> w1 = registry.StartWatch(id, 4);
  ASSERT_TRUE(w1.ok()) << w1.status();
  absl::StatusOr<std::unique_ptr<JobRegistry::Watch>> w2 = registry.StartWatch(id, 0);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(registry.StartWatch(id, 0).status().code(), absl::StatusCode::kResourceExhausted);
  w1->reset();
  EXPECT_TRUE(registry.StartWatch(id, 0).ok()) << "a finished watcher frees its slot";
}

TEST(JobRegistryTest, EndedJobsKeepLessHistoryAndTheOldestAreForgotten) {
  JobRegistryOptions options;
  options.finished_event_buffer_events = 2;
  options.max_finished_jobs = 2;
  JobRegistry registry(options, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(registry.Submit(Spec("j"), Spec("j"), absl::StrCat("req-", i))->id());
    registry.TakeNext(absl::ZeroDuration());
    for (int k = 0; k < 5; ++k) registry.AppendLog(ids.back(), ferry::v1::SEVERITY_INFO, "x");
    if (i == 0) {
      std::unique_ptr<JobRegistry::Watch> watch = *registry.StartWatch(ids[0], 0);
      registry.Finish(ids[0], ferry::v1::JOB_STATE_SUCCEEDED, "");
      EXPECT_EQ(watch->events().last_seq() - watch->events().first_seq() + 1, 2u);
    } else {
      registry.Finish(ids.back(), ferry::v1::JOB_STATE_SUCCEEDED, "");
    }
  }
  EXPECT_EQ(registry.Get(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Get(ids[1]).ok());
  EXPECT_TRUE(registry.Get(ids[2]).ok());
  EXPECT_EQ(registry.List(100, "", {})->jobs.size(), 2u);
  // Its request_id is free again.
  EXPECT_NE(registry.Submit(Spec("other"), Spec("other"), "req-0")->id(), ids[0]);
}

TEST(JobRegistryTest, DrainRefusesSubmitsAndStopsTheRunningJob) {
  JobRegistry registry({}, nullptr);
  registry.Submit(Spec("a"), Spec("a"), "");
  registry.Submit(Spec("b"), Spec("b"), "");
  std::optional<RunnableJob> running = registry.TakeNext(absl::ZeroDuration());
  registry.BeginDrain("SIGTERM");
  EXPECT_TRUE(running->stop->requested());
  EXPECT_EQ(registry.Submit(Spec("c"), Spec("c"), "").status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(registry.TakeNext(absl::ZeroDuration()).has_value());
}

// An executor that "trains" by reporting a few steps, honouring stop requests.
class FakeExecutor : public JobExecutor {
 public:
  RunOutcome Run(const std::string& job_id, const JobSpec& spec, const StopSignal& stop,
                 RunListener* listener) override {
    (void)job_id;
    ++runs;
    listener->OnStarted("fake:0");
    for (uint64_t step = 1; step <= spec.train().steps(); ++step) {
      if (stop.WaitFor(absl::Milliseconds(step_millis))) {
        return {ferry::v1::JOB_STATE_CANCELLED, stop.reason()};
      }
      ferry::v1::Progress p;
      p.set_step(step);
      p.set_total_steps(spec.train().steps());
      listener->OnProgress(p);
    }
    listener->OnPlacement(ferry::v1::MemoryPlacement());
    if (spec.name() == "fail") return {ferry::v1::JOB_STATE_FAILED, "boom"};
    return {ferry::v1::JOB_STATE_SUCCEEDED, ""};
  }
  std::atomic<int> runs{0};
  int step_millis = 1;
};

bool WaitForState(JobRegistry& registry, const std::string& id, JobState state) {
  for (int i = 0; i < 2000; ++i) {
    if (registry.Get(id)->state() == state) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

TEST(JobRunnerTest, RunsJobsOneAtATimeToTheirEnd) {
  JobRegistry registry({}, nullptr);
  FakeExecutor executor;
  JobRunner runner(&registry, &executor);
  runner.Start();
  const std::string ok = registry.Submit(Spec("ok", 5), Spec("ok", 5), "")->id();
  const std::string bad = registry.Submit(Spec("fail", 2), Spec("fail", 2), "")->id();
  EXPECT_TRUE(WaitForState(registry, ok, ferry::v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(WaitForState(registry, bad, ferry::v1::JOB_STATE_FAILED));
  EXPECT_EQ(registry.Get(bad)->error(), "boom");
  EXPECT_EQ(registry.Get(ok)->progress().step(), 5u);
  EXPECT_EQ(registry.Get(ok)->device(), "fake:0");
  registry.BeginDrain("test over");
  runner.Join();
  EXPECT_EQ(executor.runs, 2);
}

// Progress events are paced; the newest one held back goes out before the
// job's end, and the job's own progress is every step's.
TEST(JobRegistryTest, ProgressEventsArePacedAndTheLastOneIsNeverLost) {
  JobRegistryOptions options;
  options.progress_event_interval = absl::Hours(1);
  JobRegistry registry(options, nullptr);
  const std::string id = registry.Submit(Spec("a"), Spec("a"), "")->id();
  registry.TakeNext(absl::ZeroDuration());
  for (uint64_t step = 1; step <= 5; ++step) {
    ferry::v1::Progress p;
    p.set_step(step);
    registry.RecordProgress(id, p);
    EXPECT_EQ(registry.Get(id)->progress().step(), step);
  }
  registry.Finish(id, ferry::v1::JOB_STATE_SUCCEEDED, "");
  std::vector<ferry::v1::JobEvent> events;
  ASSERT_TRUE(registry.StartWatch(id, 0).value()->events().ReadAfter(0, 100, &events).ok());
  std::vector<uint64_t> steps;
  for (const auto& e : events) {
    if (e.has_progress()) steps.push_back(e.progress().step());
  }
  EXPECT_EQ(steps, (std::vector<uint64_t>{1, 5})) << "the first at once, the last before the end";
  ASSERT_TRUE(events.back().has_state_change());
  EXPECT_TRUE(events[events.size() - 2].has_progress());
}

// A step that evaluated always gets its own event, and the job keeps the
// evaluation before training and the newest one.
TEST(JobRegistryTest, EvaluationsAreNeverPacedAwayAndTheJobKeepsThem) {
  JobRegistryOptions options;
  options.progress_event_interval = absl::Hours(1);
  JobRegistry registry(options, nullptr);
  const std::string id = registry.Submit(Spec("a"), Spec("a"), "")->id();
  registry.TakeNext(absl::ZeroDuration());
  for (uint64_t step = 1; step <= 6; ++step) {
    ferry::v1::Progress p;
    p.set_step(step);
    if (step == 1) p.mutable_initial_eval()->set_loss(4.0);
    if (step % 3 == 0) {
      p.mutable_eval()->set_step(step);
      p.mutable_eval()->set_loss(4.0 - step * 0.5);
    }
    registry.RecordProgress(id, p);
  }
  const Job job = *registry.Get(id);
  EXPECT_DOUBLE_EQ(job.initial_eval().loss(), 4.0);
  EXPECT_EQ(job.last_eval().step(), 6u);
  EXPECT_DOUBLE_EQ(job.last_eval().loss(), 1.0);
  registry.Finish(id, ferry::v1::JOB_STATE_SUCCEEDED, "");
  std::vector<ferry::v1::JobEvent> events;
  ASSERT_TRUE(registry.StartWatch(id, 0).value()->events().ReadAfter(0, 100, &events).ok());
  std::vector<uint64_t> evals;
  for (const auto& e : events) {
    if (e.has_progress() && e.progress().has_eval()) evals.push_back(e.progress().eval().step());
  }
  EXPECT_EQ(evals, (std::vector<uint64_t>{3, 6}));
}

TEST(JobRunnerTest, AFailedRunIsRestartedUpToMaxRestarts) {
  JobRegistry registry({}, nullptr);
  FakeExecutor executor;
  JobRunner runner(&registry, &executor);
  runner.Start();
  JobSpec spec = Spec("fail", 2);
  spec.set_max_restarts(2);
  const std::string id = registry.Submit(spec, spec, "")->id();
  EXPECT_TRUE(WaitForState(registry, id, ferry::v1::JOB_STATE_FAILED));
  EXPECT_EQ(registry.Get(id)->attempts(), 3u);
  registry.BeginDrain("test over");
  runner.Join();
  EXPECT_EQ(executor.runs, 3);
}

// The drained job goes back to the queue (PENDING, to resume at the next
// start), ahead of the rest, which stay queued.
TEST(JobRunnerTest, DrainStopsTheRunningJobAndLeavesTheQueue) {
  JobRegistry registry({}, nullptr);
  FakeExecutor executor;
  executor.step_millis = 50;
  JobRunner runner(&registry, &executor);
  runner.Start();
  const std::string long_job = registry.Submit(Spec("long", 1000), Spec("long", 1000), "")->id();
  const std::string queued = registry.Submit(Spec("next"), Spec("next"), "")->id();
  ASSERT_TRUE(WaitForState(registry, long_job, ferry::v1::JOB_STATE_RUNNING));
  registry.BeginDrain("the daemon is shutting down");
  runner.Join();
  EXPECT_EQ(registry.Get(long_job)->state(), ferry::v1::JOB_STATE_PENDING);
  EXPECT_FALSE(registry.Get(long_job)->cancel_requested());
  EXPECT_EQ(registry.Get(long_job)->attempts(), 1u);
  EXPECT_EQ(registry.Get(queued)->state(), ferry::v1::JOB_STATE_PENDING);
  std::vector<ferry::v1::JobEvent> events;
  ASSERT_TRUE(registry.StartWatch(long_job, 0).value()->events().ReadAfter(0, 1000, &events).ok());
  ASSERT_TRUE(events.back().has_state_change());
  EXPECT_EQ(events.back().state_change().reason(),
            "the daemon is shutting down; the job resumes from step 0 (no checkpoint.dir) when the daemon starts "
            "again");
}

}  // namespace
}  // namespace ferry
