#include "engine/checkpoint/async_writer.h"

#include <chrono>
#include <utility>

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

AsyncCheckpointWriter::AsyncCheckpointWriter(WriteFn write, DoneFn on_done)
    : write_(std::move(write)), on_done_(std::move(on_done)) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() { (void)JoinPrevious(); }

absl::Status AsyncCheckpointWriter::JoinPrevious() {
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  absl::Status s = std::move(unreturned_);
  unreturned_ = absl::OkStatus();
  return s;
}

absl::Status AsyncCheckpointWriter::Submit(CheckpointContents contents, double snapshot_seconds) {
  const Clock::time_point waiting = Clock::now();
  absl::Status previous = JoinPrevious();
  const double blocked = snapshot_seconds + SecondsSince(waiting);
  {
    absl::MutexLock lock(&mu_);
    busy_ = true;
    ++submitted_;
  }
  // Produced files may read live training state: such a write is done
  // before Submit returns, and the whole of it held the caller up.
  const bool produced = !contents.produced.empty();
  thread_ = std::thread([this, blocked, produced, contents = std::move(contents)]() mutable {
    const Clock::time_point start = Clock::now();
    CheckpointWriteResult result;
    result.step = contents.step;
    for (const auto& [name, bytes] : contents.files) result.bytes += bytes.size();
    for (auto& [name, produce] : contents.produced) {
      produce = [inner = std::move(produce), &result](const ByteSink& sink) {
        return inner([&](const void* data, size_t size) {
          result.bytes += size;
          return sink(data, size);
        });
      };
    }
    result.status = write_(contents);
    result.total_seconds = blocked + SecondsSince(start);
    result.blocked_seconds = produced ? result.total_seconds : blocked;
    if (on_done_) on_done_(result);
    absl::MutexLock lock(&mu_);
    if (!result.status.ok()) {
      ++failed_;
      if (unreturned_.ok()) unreturned_ = result.status;
    }
    busy_ = false;
  });
  if (produced) thread_.join();
  return previous;
}

absl::Status AsyncCheckpointWriter::Wait() { return JoinPrevious(); }

bool AsyncCheckpointWriter::Busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

int64_t AsyncCheckpointWriter::submitted() const {
  absl::MutexLock lock(&mu_);
  return submitted_;
}

int64_t AsyncCheckpointWriter::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

}  // namespace ferry
