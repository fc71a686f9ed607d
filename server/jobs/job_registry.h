#pragma once

// The daemon's jobs: their records, the FIFO queue of pending ones, their
// event streams, and the state machine between them.
//
//   PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
//   PENDING -> CANCELLED
//   RUNNING -> PENDING   the daemon stopped while the job ran; it resumes
//                        from its newest checkpoint once the daemon runs again
//
// With a JobStore, every change that must outlive the daemon (a submit, a
// state change, a run starting, a checkpoint, and progress at most every
// few seconds) is written to it before the change is visible; Recover()
// reads it back at start.
//
// Thread-safe. Every state change and progress report is appended to the
// job's EventBuffer under the registry's lock, so a snapshot and the seq it
// reflects always agree.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/job.pb.h"
#include "ferry/v1/memory.pb.h"
#include "ferry/v1/spec.pb.h"
#include "server/jobs/event_buffer.h"
#include "server/jobs/job_listener.h"
#include "server/jobs/job_store.h"
#include "server/jobs/stop_signal.h"

namespace ferry {

struct JobRegistryOptions {
  // Pending jobs allowed at once; more are RESOURCE_EXHAUSTED. Default 1000.
  size_t max_queued_jobs = 1000;
  // Events kept per job for watchers that resume. Default 4096.
  size_t event_buffer_events = 4096;
  // Concurrent watchers of one job; more are RESOURCE_EXHAUSTED. Default 256.
  size_t max_watchers_per_job = 256;
  // Events kept per job once it has ended. Default 128.
  size_t finished_event_buffer_events = 128;
  // Ended jobs remembered; beyond this the oldest are forgotten (NOT_FOUND).
  // Default 10000.
  size_t max_finished_jobs = 10000;
  // Where jobs are kept across restarts; null keeps them in memory only.
  // Must outlive the registry.
  JobStore* store = nullptr;
  // A job found running at start (the daemon stopped without draining it)
  // resumes at most this many times; once more and it fails. Default 3.
  uint32_t max_interrupted_runs = 3;
  // Progress is written to the store at most this often per job (state
  // changes, runs and checkpoints at once). Default 2 s.
  absl::Duration progress_write_interval = absl::Seconds(2);
  // A job's progress becomes a watch event at most this often; the newest
  // progress in between is sent when the interval has passed, and always
  // before the job's next state change (Job.progress, metrics and the
  // listener see every step regardless). Zero: an event per step. Default 0.
  absl::Duration progress_event_interval = absl::ZeroDuration();
};

// A job handed to the runner.
struct RunnableJob {
  std::string id;
  ferry::v1::JobSpec spec;
  std::shared_ptr<StopSignal> stop;
};

class JobRegistry {
 public:
  // `listener` may be null; it must outlive the registry.
  JobRegistry(JobRegistryOptions options, JobListener* listener);

  // Reads the store's jobs back (before any other call): ended jobs are
  // listed as they ended, pending ones queue again in their order, and jobs
  // that were running when the daemon stopped queue first to resume
  // (FAILED instead once interrupted more than max_interrupted_runs times).
  // Returns how many jobs were recovered.
  absl::StatusOr<size_t> Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // Enqueues a job in state PENDING. `submitted` is the spec as the client
  // sent it (compared for request_id reuse), `resolved` the spec that runs.
  // A request_id seen before with the same `submitted` spec returns that job;
  // with another spec, ALREADY_EXISTS. RESOURCE_EXHAUSTED when the queue is
  // full, UNAVAILABLE once draining.
  absl::StatusOr<ferry::v1::Job> Submit(const ferry::v1::JobSpec& submitted,
                                        const ferry::v1::JobSpec& resolved,
                                        const std::string& request_id) ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND for an unknown id.
  absl::StatusOr<ferry::v1::Job> Get(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);

  struct Page {
    std::vector<ferry::v1::Job> jobs;
    std::string next_page_token;
  };
  // Jobs in submission order. INVALID_ARGUMENT for a page token that did not
  // come from List.
  absl::StatusOr<Page> List(size_t page_size, const std::string& page_token,
                            const std::vector<ferry::v1::JobState>& states) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // A pending job is cancelled at once; a running one is asked to stop and
  // is returned still RUNNING, with cancel_requested set. FAILED_PRECONDITION
  // for a job that has ended, NOT_FOUND for an unknown id.
  absl::StatusOr<ferry::v1::Job> Cancel(const std::string& id, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- For the runner. ---

  // Waits up to `timeout` for a pending job, marks it RUNNING and returns it.
  // nullopt on timeout or once draining.
  std::optional<RunnableJob> TakeNext(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // A run of the job is starting; returns its number (Job.attempts).
  uint32_t BeginRun(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // A run failed; returns how many runs of the job have failed, across
  // restarts of the daemon (for max_restarts).
  uint32_t RecordFailedRun(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // A worker wrote a complete checkpoint (stamped with the time now).
  void RecordCheckpoint(const std::string& id, const ferry::v1::CheckpointInfo& checkpoint)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A worker could not write the checkpoint of `step` (told to the listener).
  void RecordCheckpointFailed(const std::string& id, uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // The worker started on `device`.
  void RecordStarted(const std::string& id, const std::string& device) ABSL_LOCKS_EXCLUDED(mu_);
  void RecordProgress(const std::string& id, const ferry::v1::Progress& progress)
      ABSL_LOCKS_EXCLUDED(mu_);
  void AppendLog(const std::string& id, ferry::v1::Severity severity, const std::string& message)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The latest memory placement of one rank of the job (placement.rank;
  // kept after the job ends).
  void RecordPlacement(const std::string& id, const ferry::v1::MemoryPlacement& placement)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND for an unknown id, INVALID_ARGUMENT for a rank the job does
  // not have, FAILED_PRECONDITION before the rank's first step.
  absl::StatusOr<ferry::v1::MemoryPlacement> GetPlacement(const std::string& id, uint32_t rank = 0) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a running job in `state` (SUCCEEDED, FAILED or CANCELLED) and closes
  // its event stream. A job stopped by the daemon's drain (not cancelled by
  // a user) goes back to PENDING instead, to resume at the next start.
  // Returns the job's state after the call.
  ferry::v1::JobState Finish(const std::string& id, ferry::v1::JobState state, const std::string& error)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- For watchers. ---

  // A watcher's start: the job as of `snapshot_seq`, and its event buffer.
  // Destroying it frees the watcher's slot.
  class Watch {
   public:
    Watch(JobRegistry* registry, std::string id, ferry::v1::Job snapshot, uint64_t snapshot_seq,
          std::shared_ptr<const EventBuffer> events);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    const ferry::v1::Job& snapshot() const { return snapshot_; }
    uint64_t snapshot_seq() const { return snapshot_seq_; }
    const EventBuffer& events() const { return *events_; }

   private:
    JobRegistry* registry_;
    std::string id_;
    ferry::v1::Job snapshot_;
    uint64_t snapshot_seq_;
    std::shared_ptr<const EventBuffer> events_;
  };
  // NOT_FOUND for an unknown id, RESOURCE_EXHAUSTED when the job has too many
  // watchers, OUT_OF_RANGE when `after_seq` is newer than the job's last
  // event or its successors were dropped.
  absl::StatusOr<std::unique_ptr<Watch>> StartWatch(const std::string& id, uint64_t after_seq)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Lifecycle. ---

  // Refuse new submissions (UNAVAILABLE) and stop handing out jobs; asks the
  // running job to stop with `reason`.
  void BeginDrain(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  bool draining() const ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs per state, for GetDaemonInfo and tests.
  std::map<ferry::v1::JobState, size_t> CountByState() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Record {
    ferry::v1::Job job;
    std::string submitted_spec;  // serialized, deterministic
    uint64_t order = 0;          // submission order, for listing
    std::shared_ptr<EventBuffer> events;
    std::shared_ptr<StopSignal> stop;
    size_t watchers = 0;
    std::map<uint32_t, ferry::v1::MemoryPlacement> placements;  // by rank
    bool cancelled_by_user = false;
    absl::Time progress_event_time = absl::InfinitePast();
    bool progress_event_pending = false;  // job.progress is newer than the last progress event
    uint32_t failed_runs = 0;
    absl::Time progress_written;
  };

  Record* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Record* Find(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotFound(const std::string& id) const;
  void SetState(Record& record, ferry::v1::JobState to, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the oldest ended jobs beyond options_.max_finished_jobs.
  void ForgetOldFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWatcher(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends job.progress as an event if one is held back.
  void FlushProgressEvent(Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the record to the store (if any); errors are logged, not
  // returned, except where the caller must refuse (Submit).
  absl::Status Write(Record& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobRegistryOptions options_;
  JobListener* const listener_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Record> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> by_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> pending_ ABSL_GUARDED_BY(mu_);
  // Ended jobs, oldest first, for forgetting them.
  std::deque<std::string> finished_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 1;
  std::mt19937_64 id_rng_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::string drain_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry
