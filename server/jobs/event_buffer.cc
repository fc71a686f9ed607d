#include "server/jobs/event_buffer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/proto_time.h"

namespace ferry {

EventBuffer::EventBuffer(size_t capacity, uint64_t last_seq)
    : capacity_(std::max<size_t>(1, capacity)), last_seq_(last_seq) {}

uint64_t EventBuffer::Append(ferry::v1::JobEvent event) {
  absl::MutexLock lock(&mu_);
  if (closed_) return 0;
  event.set_seq(++last_seq_);
  if (!event.has_time()) ToProtoTime(absl::Now(), event.mutable_time());
  events_.push_back(std::move(event));
  if (events_.size() > capacity_) events_.pop_front();
  return last_seq_;
}

void EventBuffer::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

void EventBuffer::Shrink(size_t capacity) {
  absl::MutexLock lock(&mu_);
  capacity_ = std::min(capacity_, std::max<size_t>(1, capacity));
  while (events_.size() > capacity_) events_.pop_front();
}

absl::Status EventBuffer::ReadAfter(uint64_t after_seq, size_t max_events, std::vector<ferry::v1::JobEvent>* out,
                                    bool* ended) const {
  absl::MutexLock lock(&mu_);
  if (ended != nullptr) *ended = false;
  const uint64_t first = last_seq_ - events_.size() + 1;
  if (after_seq + 1 < first) {
    return absl::OutOfRangeError(absl::StrCat(
        "events ", after_seq + 1, " to ", first - 1,
        " were dropped from the job's event buffer (it keeps the newest ", capacity_,
        "); watch again with after_seq=0 to start from a fresh snapshot"));
  }
  uint64_t seq = after_seq + 1;
  for (; seq <= last_seq_ && max_events > 0; ++seq, --max_events) {
    out->push_back(events_[seq - first]);
  }
  if (ended != nullptr) *ended = closed_ && seq > last_seq_;
  return absl::OkStatus();
}

bool EventBuffer::WaitForEventsAfter(uint64_t after_seq, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this, after_seq]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return last_seq_ > after_seq || closed_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return last_seq_ > after_seq;
}

uint64_t EventBuffer::last_seq() const {
  absl::MutexLock lock(&mu_);
  return last_seq_;
}

uint64_t EventBuffer::first_seq() const {
  absl::MutexLock lock(&mu_);
  return last_seq_ - events_.size() + 1;
}

bool EventBuffer::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

}  // namespace ferry
