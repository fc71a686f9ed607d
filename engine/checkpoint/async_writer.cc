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
  thread_ = std::thread([this, blocked, contents = std::move(contents)]() {
    const Clock::time_point start = Clock::now();
    CheckpointWriteResult result;
    result.step = contents.step;
    for (const auto& [name, bytes] : contents.files) result.bytes += bytes.size();
    result.status = write_(contents);
    result.blocked_seconds = blocked;
    result.total_seconds = blocked + SecondsSince(start);
    if (on_done_) on_done_(result);
    absl::MutexLock lock(&mu_);
    if (!result.status.ok()) {
      ++failed_;
      if (unreturned_.ok()) unreturned_ = result.status;
    }
    busy_ = false;
  });
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
