#include "engine/memory/host_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace ferry {
namespace {

TEST(HostWorkerTest, RunsTasksInOrderBesideTheCaller) {
  HostWorker worker;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<int> order;
  // The first task holds the worker until the caller lets it go: the
  // caller is not blocked by submitting, and what follows waits its turn.
  auto first = worker.Submit([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
    order.push_back(1);
  });
  auto second = worker.Submit([&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(2);
  });
  EXPECT_FALSE(first->done());
  EXPECT_FALSE(second->done());
  EXPECT_TRUE(Pending(second));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  second->Wait();
  EXPECT_TRUE(first->done());
  EXPECT_FALSE(Pending(second));
  EXPECT_FALSE(Pending(nullptr));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(HostWorkerTest, AnErrorIsThrownToWhoeverWaits) {
  HostWorker worker;
  auto failing = worker.Submit([] { throw std::runtime_error("kernel failed"); });
  std::atomic<bool> ran{false};
  auto after = worker.Submit([&] { ran = true; });
  worker.WaitAll();  // does not throw
  EXPECT_TRUE(ran);
  EXPECT_NO_THROW(after->Wait());
  try {
    failing->Wait();
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "kernel failed");
  }
  EXPECT_THROW(failing->Wait(), std::runtime_error);  // every time
}

TEST(HostWorkerTest, StoppingRunsWhatWasSubmitted) {
  std::atomic<int> ran{0};
  {
    HostWorker worker;
    for (int i = 0; i < 100; ++i) worker.Submit([&] { ++ran; });
  }
  EXPECT_EQ(ran, 100);
}

}  // namespace
}  // namespace ferry
