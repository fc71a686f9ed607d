#pragma once

// Where a job's disk tier keeps its chunk files: one directory per job,
// one per rank inside it, so that two jobs (or two ranks) never share
// files. The worker prepares its rank's directory; the daemon removes the
// job's once the run's workers have ended.
//
// Under memory.disk_dir, with confined roots, the directories are opened
// beneath their root without following links (safe_path.h), so a link put
// in place of the directory, or above it, after the job was submitted is
// refused, and emptying or removing one never leaves it. The engine's
// DiskStore then opens its scratch directory inside by path: a link swapped
// in between PrepareRankDiskDir and the store's open would be followed.
// Closing that gap needs a DiskStore that works beneath a directory
// descriptor.

#include <string>

#include "absl/status/status.h"
#include "engine/common/safe_path.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// The job's disk tier directory: memory.disk_dir/ferry-<job_id> when the
// spec sets memory.disk_dir, else <job_dir>/scratch (job_dir: the job's
// directory under the daemon's state directory); "" when neither is there
// (a worker run on its own without memory.disk_dir: no disk tier).
std::string JobDiskDir(const ferry::v1::JobSpec& spec, const std::string& job_id, const std::string& job_dir);

// One rank's directory inside the job's: <job_disk_dir>/rank<r>.
std::string RankDiskDir(const std::string& job_disk_dir, int rank);

// Creates the rank's directory (with its parents) and removes what it
// holds: chunk files a run killed before it left behind. Confined by
// `roots` when the directory is under memory.disk_dir (messages name that
// field); the job's own directory is the daemon's and is not.
absl::Status PrepareRankDiskDir(const ferry::v1::JobSpec& spec, const std::string& rank_dir,
                                const AllowedRoots& roots);

// Removes the job's disk tier directory and everything in it. OK when it
// is not there. Call once no worker of the job runs.
absl::Status RemoveJobDiskDir(const ferry::v1::JobSpec& spec, const std::string& job_id, const std::string& job_dir,
                              const AllowedRoots& roots);

}  // namespace ferry
