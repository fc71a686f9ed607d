#include "engine/memory/host_worker.h"

#include <utility>

namespace ferry {

bool HostTask::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void HostTask::Wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_ != nullptr) std::rethrow_exception(error_);
}

HostWorker::HostWorker() : thread_([this] { Run(); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

std::shared_ptr<const HostTask> HostWorker::Submit(std::function<void()> fn) {
  auto task = std::make_shared<HostTask>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(fn), task});
  }
  work_.notify_all();
  return task;
}

void HostWorker::WaitAll() const {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !running_; });
}

void HostWorker::Run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    std::exception_ptr error;
    try {
      item.fn();
    } catch (...) {
      error = std::current_exception();
    }
    item.fn = nullptr;  // what it held goes before it counts as done
    {
      std::lock_guard<std::mutex> lock(item.task->mu_);
      item.task->done_ = true;
      item.task->error_ = error;
    }
    item.task->cv_.notify_all();
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    idle_.notify_all();
  }
}

}  // namespace ferry
