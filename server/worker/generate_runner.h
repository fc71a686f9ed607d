#pragma once

// The daemon's side of Generate: runs `ferry-worker --generate` (a process,
// like training and exports, so that the daemon never loads LibTorch or a
// model) and relays its responses as they come.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "ferry/v1/ferry.pb.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// Writes the request (and the job's spec, when `spec` is not null) beside
// each other in `work_dir` (created if missing), runs `worker_binary
// --generate=REQUEST [--spec=SPEC] --report_fd=3` on the CPU and calls
// `on_response` with each response as the worker sends it (returning false
// stops the worker: CANCELLED). `cancelled` is polled (true kills it). The
// worker's own error as it is (its code and message); INTERNAL with how it
// ended and the end of its output when it dies without one. `allowed_roots`
// (comma-separated; empty: none) goes to the worker.
absl::Status RunWorkerGenerate(const std::string& worker_binary, const std::string& work_dir,
                               const ferry::v1::JobSpec* spec, const ferry::v1::GenerateRequest& request,
                               const std::function<bool(const ferry::v1::GenerateResponse&)>& on_response,
                               const std::function<bool()>& cancelled, const std::string& allowed_roots = "");

}  // namespace ferry
