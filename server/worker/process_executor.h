#pragma once

#include <string>

#include "absl/time/time.h"
#include "server/jobs/job_executor.h"

namespace ferry {

struct ProcessExecutorOptions {
  // Path of the ferry-worker binary.
  std::string worker_binary;
  // Each job gets jobs_dir/<job id>/ holding spec.json and worker.log.
  std::string jobs_dir;
  // Passed to the worker: auto, cpu, cuda, cuda:N. Default auto.
  std::string device = "auto";
  // Passed to the worker as --allowed_roots (comma-separated) when not
  // empty: it opens the job's paths only beneath these directories.
  std::string allowed_roots;
  // After asking a worker to stop, how long to wait before killing it.
  // Default 30 s.
  absl::Duration stop_grace = absl::Seconds(30);
};

// Runs each job in a ferry-worker process: writes the spec to the job's
// directory, starts the worker in its own process group, relays its reports,
// sends it a stop command when asked (and kills the group if it does not
// stop within the grace period), and turns a crash into a FAILED outcome with
// the cause and the end of the worker's log. Once a run's workers have
// ended, removes the job's disk tier directory (disk_tier_dir.h).
class ProcessExecutor : public JobExecutor {
 public:
  explicit ProcessExecutor(ProcessExecutorOptions options);

  RunOutcome Run(const std::string& job_id, const ferry::v1::JobSpec& spec,
                 const StopSignal& stop, RunListener* listener) override;

 private:
  ProcessExecutorOptions options_;
};

}  // namespace ferry
