#pragma once

// The daemon's durable record of its jobs: one SQLite database (WAL mode,
// fsync on every commit) under the state directory. A row per job holds the
// spec as submitted, the Job as last known (spec as it runs, state, times,
// attempts, progress, final figures, last checkpoint) and its place in the
// queue. The registry writes a row whenever a job changes in a way that
// must survive the daemon; the daemon reads them all back at start.
//
// Not thread-safe: the registry calls it under its own lock.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/job.pb.h"

struct sqlite3;

namespace ferry {

class JobStore {
 public:
  struct Row {
    ferry::v1::Job job;
    std::string submitted_spec;  // serialized, deterministic
    uint64_t order = 0;          // submission order
    uint64_t last_seq = 0;       // the job's newest event when written
    uint32_t failed_runs = 0;    // runs that failed, for max_restarts
  };

  // Opens (creating if needed) the database at `path`. FAILED_PRECONDITION
  // naming the path when it cannot be opened, is not a Ferry job store, or
  // was written by a newer release.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Every job, in submission order.
  absl::StatusOr<std::vector<Row>> LoadAll();
  // Inserts or replaces the job's row; durable when it returns OK.
  absl::Status Put(const Row& row);
  // Forgets a job.
  absl::Status Delete(const std::string& id);

  const std::string& path() const { return path_; }

 private:
  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql);
  absl::Status Error(const std::string& what) const;

  sqlite3* db_;
  std::string path_;
};

}  // namespace ferry
