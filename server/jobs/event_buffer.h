#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/job.pb.h"

namespace ferry {

// A job's recent events, numbered 1, 2, 3, ... Appending never waits for
// readers: when the buffer is full the oldest event is dropped, and a reader
// that asks for it learns so (OUT_OF_RANGE) instead of silently missing it.
// Thread-safe.
class EventBuffer {
 public:
  // Keeps the newest `capacity` events (at least 1). The first event
  // appended gets seq `last_seq` + 1: a job recovered after a restart of the
  // daemon continues its numbering, so a watcher's old resume point is
  // reported as gone (OUT_OF_RANGE) rather than taken for a new event.
  explicit EventBuffer(size_t capacity, uint64_t last_seq = 0);

  // Stamps `event` with the next seq (and the time, if unset) and appends it.
  // Returns its seq. Appending to a closed buffer is ignored and returns 0.
  uint64_t Append(ferry::v1::JobEvent event) ABSL_LOCKS_EXCLUDED(mu_);

  // No more events will come; wakes every waiter.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Keeps only the newest `capacity` events from now on (at least 1): a
  // finished job needs less history than a running one.
  void Shrink(size_t capacity) ABSL_LOCKS_EXCLUDED(mu_);

  // Appends to `out` the events with seq > after_seq, oldest first, at most
  // `max_events`. OUT_OF_RANGE if some of them have already been dropped.
  // If `ended` is given it is set, under the same lock, to whether the
  // buffer is closed and `out` now reaches its last event: a reader that
  // checked closed() separately could miss an event appended just before
  // Close().
  absl::Status ReadAfter(uint64_t after_seq, size_t max_events, std::vector<ferry::v1::JobEvent>* out,
                         bool* ended = nullptr) const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout` for an event with seq > after_seq or for Close().
  // True if such an event exists.
  bool WaitForEventsAfter(uint64_t after_seq, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The seq of the newest event; 0 when none has been appended.
  uint64_t last_seq() const ABSL_LOCKS_EXCLUDED(mu_);
  // The seq of the oldest event still held; last_seq() + 1 when empty.
  uint64_t first_seq() const ABSL_LOCKS_EXCLUDED(mu_);
  bool closed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  size_t capacity_ ABSL_GUARDED_BY(mu_);
  std::deque<ferry::v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry
