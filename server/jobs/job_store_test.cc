// The job store on its own, and the registry writing to it and reading it
// back as a restarted daemon would.
#include "server/jobs/job_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_registry.h"

namespace ferry {
namespace {

using ferry::v1::Job;
using ferry::v1::JobSpec;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, "-", getpid(), ".db");
  unlink(path.c_str());
  unlink((path + "-wal").c_str());
  unlink((path + "-shm").c_str());
  return path;
}

JobSpec Spec(const std::string& name, const std::string& checkpoint_dir = "") {
  JobSpec spec;
  spec.set_name(name);
  spec.mutable_train()->set_steps(10);
  if (!checkpoint_dir.empty()) spec.mutable_checkpoint()->set_dir(checkpoint_dir);
  return spec;
}

TEST(JobStoreTest, RowsRoundTripInOrderAndCanBeReplacedAndDeleted) {
  const std::string path = TempPath("rows");
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 3; i >= 1; --i) {
      JobStore::Row row;
      row.job.set_id(absl::StrCat("j-", i));
      row.job.set_state(ferry::v1::JOB_STATE_PENDING);
      row.job.mutable_spec()->set_name(absl::StrCat("job ", i));
      row.order = static_cast<uint64_t>(i);
      row.submitted_spec = std::string("\0\1", 2);
      row.last_seq = 10u * i;
      ASSERT_TRUE((*store)->Put(row).ok());
    }
    JobStore::Row changed;
    changed.job.set_id("j-2");
    changed.job.set_state(ferry::v1::JOB_STATE_SUCCEEDED);
    changed.order = 2;
    changed.failed_runs = 4;
    ASSERT_TRUE((*store)->Put(changed).ok());
    ASSERT_TRUE((*store)->Delete("j-3").ok());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> reopened = JobStore::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<std::vector<JobStore::Row>> rows = (*reopened)->LoadAll();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].job.id(), "j-1");
  EXPECT_EQ((*rows)[0].job.spec().name(), "job 1");
  EXPECT_EQ((*rows)[0].submitted_spec, std::string("\0\1", 2));
  EXPECT_EQ((*rows)[0].last_seq, 10u);
  EXPECT_EQ((*rows)[1].job.id(), "j-2");
  EXPECT_EQ((*rows)[1].job.state(), ferry::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ((*rows)[1].failed_runs, 4u);
}

TEST(JobStoreTest, RefusesWhatItCannotUse) {
  // Not a database.
  const std::string junk = TempPath("junk");
  std::ofstream(junk) << "this is not an SQLite file, just text long enough to have a header........";
  absl::StatusOr<std::unique_ptr<JobStore>> opened = JobStore::Open(junk);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find(junk), std::string::npos) << opened.status();
  // A store from a newer release.
  const std::string newer = TempPath("newer");
  ASSERT_EQ(std::system(("sqlite3 " + newer + " 'PRAGMA user_version=99' >/dev/null").c_str()), 0);
  opened = JobStore::Open(newer);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find("newer than this ferryd"), std::string::npos) << opened.status();
  // A directory that cannot be written.
  opened = JobStore::Open("/proc/ferry-no-such/jobs.db");
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find("/proc/ferry-no-such/jobs.db"), std::string::npos);
}

// A daemon that stops (crashes) with jobs in every state; a new registry on
// the same store sees them all, resumes the interrupted one first, then the
// queue in order; the ended ones stay ended; ids, request ids and event
// numbering carry over.
TEST(JobStoreTest, RegistryRecoversEveryJobAfterACrash) {
  const std::string path = TempPath("recover");
  std::string done, running, queued1, queued2, cancelled;
  uint64_t running_seq = 0;
  {
    std::unique_ptr<JobStore> store = *JobStore::Open(path);
    JobRegistryOptions options;
    options.store = store.get();
    JobRegistry registry(options, nullptr);
    ASSERT_EQ(*registry.Recover(), 0u);
    done = registry.Submit(Spec("done"), Spec("done"), "")->id();
    running = registry.Submit(Spec("running"), Spec("running", "/ckpt"), "req-r")->id();
    queued1 = registry.Submit(Spec("q1"), Spec("q1"), "")->id();
    cancelled = registry.Submit(Spec("c"), Spec("c"), "")->id();
    queued2 = registry.Submit(Spec("q2"), Spec("q2"), "")->id();
    ASSERT_EQ(registry.TakeNext(absl::ZeroDuration())->id, done);
    EXPECT_EQ(registry.BeginRun(done), 1u);
    ferry::v1::Progress progress;
    progress.set_step(10);
    progress.set_loss(1.5);
    registry.RecordProgress(done, progress);
    registry.Finish(done, ferry::v1::JOB_STATE_SUCCEEDED, "");
    ASSERT_EQ(registry.TakeNext(absl::ZeroDuration())->id, running);
    registry.BeginRun(running);
    ferry::v1::CheckpointInfo checkpoint;
    checkpoint.set_step(40);
    checkpoint.set_path("/ckpt/rank0/step-000000000040");
    registry.RecordCheckpoint(running, checkpoint);
    ASSERT_TRUE(registry.Cancel(cancelled, "no longer needed").ok());
    running_seq = registry.StartWatch(running, 0).value()->snapshot_seq();
    // The daemon dies here: no drain, no Finish.
  }
  std::unique_ptr<JobStore> store = *JobStore::Open(path);
  JobRegistryOptions options;
  options.store = store.get();
  JobRegistry registry(options, nullptr);
  ASSERT_EQ(*registry.Recover(), 5u);

  Job d = *registry.Get(done);
  EXPECT_EQ(d.state(), ferry::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(d.progress().loss(), 1.5);
  EXPECT_EQ(registry.Get(cancelled)->state(), ferry::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(registry.Get(cancelled)->error(), "no longer needed");

  Job r = *registry.Get(running);
  EXPECT_EQ(r.state(), ferry::v1::JOB_STATE_PENDING);
  EXPECT_EQ(r.interrupted_runs(), 1u);
  EXPECT_EQ(r.attempts(), 1u);
  EXPECT_EQ(r.last_checkpoint().step(), 40u);
  EXPECT_TRUE(r.last_checkpoint().has_time());
  // The same request id still finds the same job.
  EXPECT_EQ(registry.Submit(Spec("running"), Spec("running", "/ckpt"), "req-r")->id(), running);
  // Its events continue the numbering; the state change says why.
  std::unique_ptr<JobRegistry::Watch> watch = registry.StartWatch(running, running_seq).value();
  std::vector<ferry::v1::JobEvent> events;
  ASSERT_TRUE(watch->events().ReadAfter(running_seq, 10, &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq(), running_seq + 1);
  EXPECT_NE(events[0].state_change().reason().find("resumes from its newest checkpoint"), std::string::npos);
  watch.reset();

  // The interrupted job first, then the queue in submission order.
  EXPECT_EQ(registry.TakeNext(absl::ZeroDuration())->id, running);
  EXPECT_EQ(registry.BeginRun(running), 2u);
  EXPECT_EQ(registry.TakeNext(absl::ZeroDuration())->id, queued1);
  EXPECT_EQ(registry.TakeNext(absl::ZeroDuration())->id, queued2);
  EXPECT_FALSE(registry.TakeNext(absl::ZeroDuration()).has_value());
  // New ids never collide with recovered ones and list after them.
  const std::string later = registry.Submit(Spec("later"), Spec("later"), "")->id();
  JobRegistry::Page page = *registry.List(100, "", {});
  ASSERT_EQ(page.jobs.size(), 6u);
  EXPECT_EQ(page.jobs[0].id(), done);
  EXPECT_EQ(page.jobs[5].id(), later);
}

TEST(JobStoreTest, AJobInterruptedTooOftenFails) {
  const std::string path = TempPath("interrupted");
  std::string id;
  for (int start = 0; start < 3; ++start) {
    std::unique_ptr<JobStore> store = *JobStore::Open(path);
    JobRegistryOptions options;
    options.store = store.get();
    options.max_interrupted_runs = 1;
    JobRegistry registry(options, nullptr);
    ASSERT_TRUE(registry.Recover().ok());
    if (start == 0) id = registry.Submit(Spec("x"), Spec("x"), "")->id();
    if (start < 2) {
      ASSERT_EQ(registry.TakeNext(absl::ZeroDuration())->id, id);
      registry.BeginRun(id);
    } else {
      Job job = *registry.Get(id);
      EXPECT_EQ(job.state(), ferry::v1::JOB_STATE_FAILED);
      EXPECT_EQ(job.interrupted_runs(), 2u);
      EXPECT_NE(job.error().find("--max_interrupted_runs=1"), std::string::npos) << job.error();
    }
  }
}

// A drain stops the running job; it goes back to PENDING (not CANCELLED)
// and is the first to run at the next start. A user's cancel still cancels.
TEST(JobStoreTest, ADrainedJobWaitsForTheNextStart) {
  const std::string path = TempPath("drain");
  std::string drained, cancelled;
  {
    std::unique_ptr<JobStore> store = *JobStore::Open(path);
    JobRegistryOptions options;
    options.store = store.get();
    JobRegistry registry(options, nullptr);
    drained = registry.Submit(Spec("a", "/ckpt"), Spec("a", "/ckpt"), "")->id();
    ASSERT_EQ(registry.TakeNext(absl::ZeroDuration())->id, drained);
    registry.BeginDrain("the daemon shut down (Terminated)");
    registry.Finish(drained, ferry::v1::JOB_STATE_CANCELLED, "stopped");
    Job job = *registry.Get(drained);
    EXPECT_EQ(job.state(), ferry::v1::JOB_STATE_PENDING);
    EXPECT_FALSE(job.cancel_requested());
  }
  {
    std::unique_ptr<JobStore> store = *JobStore::Open(path);
    JobRegistryOptions options;
    options.store = store.get();
    JobRegistry registry(options, nullptr);
    ASSERT_TRUE(registry.Recover().ok());
    EXPECT_EQ(registry.Get(drained)->interrupted_runs(), 0u) << "a drain is not an interruption";
    ASSERT_EQ(registry.TakeNext(absl::ZeroDuration())->id, drained);
    ASSERT_TRUE(registry.Cancel(drained, "by a user").ok());
    registry.BeginDrain("shutting down");
    registry.Finish(drained, ferry::v1::JOB_STATE_CANCELLED, "by a user");
    EXPECT_EQ(registry.Get(drained)->state(), ferry::v1::JOB_STATE_CANCELLED);
  }
}

// A store that can no longer be written refuses submits (nothing a client
// was told is accepted may be lost) and the registry goes on serving.
TEST(JobStoreTest, ASubmitTheStoreCannotRecordIsRefused) {
  const std::string path = TempPath("refuse");
  std::unique_ptr<JobStore> store = *JobStore::Open(path);
  JobRegistryOptions options;
  options.store = store.get();
  JobRegistry registry(options, nullptr);
  const std::string kept = registry.Submit(Spec("a"), Spec("a"), "")->id();
  // Every later write fails, as on a full or broken disk.
  const std::string sql =
      "CREATE TRIGGER refuse BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;";
  ASSERT_EQ(std::system(("sqlite3 " + path + " \"" + sql + "\"").c_str()), 0);
  absl::StatusOr<Job> refused = registry.Submit(Spec("b"), Spec("b"), "req-b");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("cannot record the job"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("disk is full"), std::string::npos) << refused.status();
  ASSERT_EQ(registry.List(100, "", {})->jobs.size(), 1u) << "the refused job is not listed";
  EXPECT_EQ(registry.CountByState()[ferry::v1::JOB_STATE_PENDING], 1u);
  EXPECT_EQ(registry.TakeNext(absl::ZeroDuration())->id, kept);
  EXPECT_FALSE(registry.TakeNext(absl::ZeroDuration()).has_value());
  // Once writable again, the same request goes through.
  ASSERT_EQ(std::system(("sqlite3 " + path + " 'DROP TRIGGER refuse'").c_str()), 0);
  EXPECT_TRUE(registry.Submit(Spec("b"), Spec("b"), "req-b").ok());
}

}  // namespace
}  // namespace ferry
