#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

// A one-way request to stop a running job, with the reason. Thread-safe.
class StopSignal {
 public:
  // The first request's reason wins.
  void Request(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (requested_) return;
    requested_ = true;
    reason_ = reason;
  }

  bool requested() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return requested_;
  }

  std::string reason() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return reason_;
  }

  // True if a stop was requested within `timeout`.
  bool WaitFor(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&requested_), timeout);
    return requested_;
  }

 private:
  mutable absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry
