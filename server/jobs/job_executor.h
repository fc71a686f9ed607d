#pragma once

// Runs one job to its end. The daemon's implementation starts ferry-worker
// processes; tests use fakes.

#include <string>

#include "ferry/v1/job.pb.h"
#include "ferry/v1/memory.pb.h"
#include "ferry/v1/spec.pb.h"
#include "server/jobs/stop_signal.h"

namespace ferry {

// What an executor reports while a job runs. Called from the executor's
// thread.
class RunListener {
 public:
  virtual ~RunListener() = default;
  virtual void OnStarted(const std::string& device) = 0;
  virtual void OnProgress(const ferry::v1::Progress& progress) = 0;
  virtual void OnLog(ferry::v1::Severity severity, const std::string& message) = 0;
  virtual void OnPlacement(const ferry::v1::MemoryPlacement& placement) = 0;
  // A worker wrote a complete checkpoint (rank 0's, for several ranks).
  virtual void OnCheckpoint(const ferry::v1::CheckpointInfo& checkpoint) { (void)checkpoint; }
  // A worker (any rank) could not write the checkpoint of `step`.
  virtual void OnCheckpointFailed(uint64_t step) { (void)step; }
};

struct RunOutcome {
  // SUCCEEDED, FAILED or CANCELLED.
  ferry::v1::JobState state = ferry::v1::JOB_STATE_FAILED;
  // For FAILED and CANCELLED: why, in words a user can act on.
  std::string error;
};

class JobExecutor {
 public:
  virtual ~JobExecutor() = default;
  // Runs the job (its spec has been through WithDefaults and validation)
  // until it ends, or until `stop` is requested, then returns. Must not throw.
  virtual RunOutcome Run(const std::string& job_id, const ferry::v1::JobSpec& spec,
                         const StopSignal& stop, RunListener* listener) = 0;
};

}  // namespace ferry
