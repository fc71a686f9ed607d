#include "engine/checkpoint/async_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/checkpoint/test_files.h"

namespace ferry {
namespace {

CheckpointContents At(int64_t step) {
  CheckpointContents c;
  c.step = step;
  c.meta["world"] = "1x1";
  c.files["rank0.chunks"] = std::string(100000, 'a') + std::to_string(step);
  return c;
}

// Every result the writer reported, in order.
class Results {
 public:
  void Add(const CheckpointWriteResult& r) {
    absl::MutexLock lock(&mu_);
    results_.push_back(r);
  }
  std::vector<CheckpointWriteResult> Get() {
    absl::MutexLock lock(&mu_);
    return results_;
  }

 private:
  absl::Mutex mu_;
  std::vector<CheckpointWriteResult> results_;
};

TEST(AsyncCheckpointWriterTest, WritesCompleteOnDiskInTheBackground) {
  const std::string root = testing::EmptyTestPath("async_complete");
  Results results;
  {
    AsyncCheckpointWriter writer([&](const CheckpointContents& c) { return WriteCheckpoint(root, c, 2); },
                                 [&](const CheckpointWriteResult& r) { results.Add(r); });
    for (int64_t step : {10, 20, 30}) EXPECT_TRUE(writer.Submit(At(step), 0.25).ok());
    EXPECT_TRUE(writer.Wait().ok());
    EXPECT_FALSE(writer.Busy());
    EXPECT_EQ(writer.submitted(), 3);
    EXPECT_EQ(writer.failed(), 0);
  }
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 30);
  EXPECT_EQ(loaded->contents.files.at("rank0.chunks"), At(30).files.at("rank0.chunks"));
  const std::vector<CheckpointWriteResult> r = results.Get();
  ASSERT_EQ(r.size(), 3u);
  for (const CheckpointWriteResult& one : r) {
    EXPECT_TRUE(one.status.ok()) << one.status;
    EXPECT_GE(one.blocked_seconds, 0.25) << "the snapshot counts as blocking";
    EXPECT_GE(one.total_seconds, one.blocked_seconds);
  }
}

// Produced files read live state: Submit returns once they are written,
// and the whole write counts as time the caller was held up.
TEST(AsyncCheckpointWriterTest, AWriteWithProducedFilesIsDoneWhenSubmitReturns) {
  const std::string root = testing::EmptyTestPath("async_produced");
  Results results;
  AsyncCheckpointWriter writer([&](const CheckpointContents& c) { return WriteCheckpoint(root, c, 2); },
                               [&](const CheckpointWriteResult& r) { results.Add(r); });
  std::string live = "state at step 5";
  CheckpointContents c = At(5);
  c.produced["rank0.live"] = [&live](const ByteSink& sink) { return sink(live.data(), live.size()); };
  ASSERT_TRUE(writer.Submit(std::move(c), 0.5).ok());
  EXPECT_FALSE(writer.Busy());
  live = "changed after Submit returned";
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.files.at("rank0.live"), "state at step 5");
  const std::vector<CheckpointWriteResult> r = results.Get();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].bytes, At(5).files.at("rank0.chunks").size() + 15) << "produced bytes counted";
  EXPECT_EQ(r[0].blocked_seconds, r[0].total_seconds);
  EXPECT_GE(r[0].blocked_seconds, 0.5);
}

TEST(AsyncCheckpointWriterTest, WritesOneAtATimeInOrder) {
  std::atomic<int> active{0}, most{0};
  std::vector<int64_t> order;  // written by one write at a time
  AsyncCheckpointWriter writer([&](const CheckpointContents& c) {
    const int now = ++active;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    order.push_back(c.step);
    --active;
    return absl::OkStatus();
  });
  for (int64_t step = 1; step <= 20; ++step) ASSERT_TRUE(writer.Submit(At(step)).ok());
  ASSERT_TRUE(writer.Wait().ok());
  EXPECT_EQ(most.load(), 1);
  ASSERT_EQ(order.size(), 20u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int64_t>(i + 1));
}

TEST(AsyncCheckpointWriterTest, SubmitReturnsAtOnceAndTheNextWaitsForThePrevious) {
  absl::Notification release;
  Results results;
  std::atomic<double> held_seconds{0};  // how long the write of step 1 waited
  AsyncCheckpointWriter writer(
      [&](const CheckpointContents& c) {
        if (c.step == 1) {
          const auto start = std::chrono::steady_clock::now();
          release.WaitForNotification();
          held_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        return absl::OkStatus();
      },
      [&](const CheckpointWriteResult& r) { results.Add(r); });
  ASSERT_TRUE(writer.Submit(At(1)).ok());  // returns while step 1 is still being written
  EXPECT_TRUE(writer.Busy());
  std::atomic<bool> second_returned{false};
  std::thread second([&] {
    EXPECT_TRUE(writer.Submit(At(2)).ok());
    second_returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(second_returned.load()) << "the second checkpoint must wait for the first write";
  release.Notify();
  second.join();
  EXPECT_TRUE(second_returned.load());
  ASSERT_TRUE(writer.Wait().ok());
  const std::vector<CheckpointWriteResult> r = results.Get();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].step, 1);
  // The whole write, which waited for the release (about 0.2 s; less when
  // the writer's thread started late).
  EXPECT_GT(held_seconds.load(), 0.0);
  EXPECT_GE(r[0].total_seconds, held_seconds.load());
  EXPECT_LT(r[0].blocked_seconds, 0.1) << "the first write blocked nobody";
  EXPECT_EQ(r[1].step, 2);
  // The second Submit starts a little after the 200 ms sleep does.
  EXPECT_GE(r[1].blocked_seconds, 0.1) << "waiting for the previous write is blocking time";
}

TEST(AsyncCheckpointWriterTest, AFailedWriteIsReportedOnceAndLaterWritesGoOn) {
  Results results;
  AsyncCheckpointWriter writer(
      [&](const CheckpointContents& c) {
        if (c.step == 2) return absl::InternalError("checkpoint: cannot write /x/rank0.chunks: No space left on device");
        return absl::OkStatus();
      },
      [&](const CheckpointWriteResult& r) { results.Add(r); });
  EXPECT_TRUE(writer.Submit(At(1)).ok());
  EXPECT_TRUE(writer.Submit(At(2)).ok()) << "step 1 was fine";
  const absl::Status third = writer.Submit(At(3));  // waits for step 2's write: its error
  EXPECT_EQ(third.code(), absl::StatusCode::kInternal);
  EXPECT_NE(third.message().find("No space left on device"), std::string::npos) << third;
  EXPECT_TRUE(writer.Wait().ok()) << "step 3 was written; step 2's error was returned already";
  EXPECT_EQ(writer.failed(), 1);
  const std::vector<CheckpointWriteResult> r = results.Get();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_TRUE(r[0].status.ok());
  EXPECT_FALSE(r[1].status.ok());
  EXPECT_EQ(r[1].step, 2);
  EXPECT_TRUE(r[2].status.ok());
}

TEST(AsyncCheckpointWriterTest, WaitReturnsTheLastWritesErrorAndTheStoreKeepsThePrevious) {
  const std::string root = testing::EmptyTestPath("async_error");
  AsyncCheckpointWriter writer([&](const CheckpointContents& c) { return WriteCheckpoint(root, c, 2); });
  ASSERT_TRUE(writer.Submit(At(100)).ok());
  ASSERT_TRUE(writer.Wait().ok());
  CheckpointContents bad = At(200);
  bad.files["../escape"] = "x";  // refused by the store
  ASSERT_TRUE(writer.Submit(std::move(bad)).ok());
  const absl::Status s = writer.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(writer.Wait().ok()) << "an error is returned once";
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.step, 100);
}

TEST(AsyncCheckpointWriterTest, TheDestructorWaitsForTheWriteInFlight) {
  std::atomic<bool> done{false};
  {
    AsyncCheckpointWriter writer([&](const CheckpointContents&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      done = true;
      return absl::OkStatus();
    });
    ASSERT_TRUE(writer.Submit(At(1)).ok());
    EXPECT_FALSE(done.load());
  }
  EXPECT_TRUE(done.load());
}

TEST(AsyncCheckpointWriterTest, WaitWithNothingSubmittedIsOk) {
  AsyncCheckpointWriter writer([](const CheckpointContents&) { return absl::OkStatus(); });
  EXPECT_TRUE(writer.Wait().ok());
  EXPECT_FALSE(writer.Busy());
}

}  // namespace
}  // namespace ferry
