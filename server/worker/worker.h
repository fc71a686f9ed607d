#pragma once

// ferry-worker: runs one rank of one job. Under the daemon it reads commands
// from stdin and writes WorkerReport frames to --report_fd; on its own (e.g.
// under a launcher) it prints progress to stdout.

#include <string>

namespace ferry {

struct WorkerOptions {
  // The job file (YAML or JSON, the JSON mapping of ferry.v1.JobSpec).
  std::string spec_path;
  // Where WorkerReport frames go; -1 prints human-readable progress on stdout
  // and reads no commands.
  int report_fd = -1;
  // Where commands come from when report_fd >= 0. End of file there means the
  // daemon has gone: the worker stops.
  int command_fd = 0;
  // "auto", "cpu", "cuda", "cuda:N".
  std::string device = "auto";
};

// Exit codes of ferry-worker.
inline constexpr int kWorkerSucceeded = 0;
inline constexpr int kWorkerFailed = 1;
inline constexpr int kWorkerBadUsage = 2;
inline constexpr int kWorkerCancelled = 3;

// Trains the job; returns the process exit code.
int RunWorker(const WorkerOptions& options);

// Prints the devices this build can use, as JSON (ferry.internal.DeviceProbe),
// on stdout; returns the exit code.
int RunProbe();

}  // namespace ferry
