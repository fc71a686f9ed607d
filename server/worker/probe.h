#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/internal/worker.pb.h"

namespace ferry {

// Runs `worker_binary --probe` and parses what it prints: the devices the
// workers will see and their LibTorch version. FAILED_PRECONDITION, with the
// worker's own words, when it cannot be run.
absl::StatusOr<ferry::internal::DeviceProbe> ProbeWorker(const std::string& worker_binary,
                                                         absl::Duration timeout);

}  // namespace ferry
