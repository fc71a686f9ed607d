#pragma once

#include <cstdint>

#include "ferry/v1/job.pb.h"
#include "ferry/v1/memory.pb.h"

namespace ferry {

// Told of every job state change and progress report, under the registry's
// lock: implementations must be quick and must not call back into it.
// The metrics exporter is one.
class JobListener {
 public:
  virtual ~JobListener() = default;
  // `from` is JOB_STATE_UNSPECIFIED for a newly submitted job.
  virtual void OnStateChange(ferry::v1::JobState from, ferry::v1::JobState to) = 0;
  // `new_tokens`: tokens processed since the job's previous report.
  virtual void OnProgress(const ferry::v1::Progress& progress, uint64_t new_tokens) = 0;
  // One rank's memory placement (every rank of a parallel job reports one).
  virtual void OnPlacement(const ferry::v1::MemoryPlacement& placement) { (void)placement; }
  // The job starts (or resumes) running; called before OnStateChange.
  virtual void OnRunning(const ferry::v1::Job& job) { (void)job; }
  // A worker wrote a complete checkpoint (time set), or could not write the
  // checkpoint of `step`.
  virtual void OnCheckpoint(const ferry::v1::CheckpointInfo& checkpoint) { (void)checkpoint; }
  virtual void OnCheckpointFailed(uint64_t step) { (void)step; }
};

}  // namespace ferry
