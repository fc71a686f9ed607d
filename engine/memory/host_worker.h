#pragma once

// A thread that runs host-side work beside the training loop, in the order
// it was submitted: the optimizer's update of the chunks updated on the
// host, while the next forward runs (chunk_optimizer.h). Each piece of work
// is a task whose completion the training loop can query and wait for.
//
// Thread-safe: the training thread submits and waits; the worker's own
// thread runs the tasks.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ferry {

class HostTask {
 public:
  // Whether it has run (never blocks).
  bool done() const;
  // Blocks until it has run; an exception it threw is thrown here (each
  // time it is waited for).
  void Wait() const;

 private:
  friend class HostWorker;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Null or done: nothing pending.
inline bool Pending(const std::shared_ptr<const HostTask>& task) { return task != nullptr && !task->done(); }

class HostWorker {
 public:
  HostWorker();
  // Runs what was submitted, then stops.
  ~HostWorker();
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  // Queues `fn` behind the tasks submitted before it.
  std::shared_ptr<const HostTask> Submit(std::function<void()> fn);
  // Blocks until every task submitted so far has run (without throwing:
  // their errors are for those who wait on them).
  void WaitAll() const;

 private:
  struct Item {
    std::function<void()> fn;
    std::shared_ptr<HostTask> task;
  };
  void Run();

  mutable std::mutex mu_;
  std::condition_variable work_;
  mutable std::condition_variable idle_;
  std::deque<Item> queue_;
  bool running_ = false;  // a task is under way
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace ferry
