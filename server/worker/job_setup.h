#pragma once

// How a job's spec sets up the engine, in one place for each way a worker
// uses a job: to train it (worker.cc), or to read its checkpoints' weights
// (generate_text.cc, export_weights.cc).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/common/safe_path.h"
#include "engine/memory/memory_options.h"
#include "engine/model/model_config.h"
#include "engine/train/train_options.h"
#include "ferry/v1/spec.pb.h"
#include "server/spec/spec_validator.h"

namespace ferry {

// A job file as the daemon took it: read, its defaults filled in, and
// validated without looking at its files (the data is not read again).
absl::StatusOr<ferry::v1::JobSpec> LoadCheckedJobFile(const std::string& path);

enum class EngineUse {
  // Training one rank on this machine.
  kTrain,
  // Restoring checkpoints once to read them out (generation, export).
  kRead,
};

// What the engine is given for a job.
struct JobEngineSetup {
  ModelConfig model;
  TrainOptions train;
  MemoryOptions memory;
};

// The engine's settings for `spec` (after WithDefaults and ValidateSpec).
// kTrain: the budgets the daemon checked the job against, their defaults
// filled in the same way for this rank (RankHostBudgetBytes), and the disk
// tier in `rank_disk_dir` ("" for none) with memory.disk_budget or, unset,
// most of the free space `machine.disk` reports there; where that is
// unknown the tier is off and `warning` says why. kRead: no host budget to
// plan within and no disk tier (whose files would land in the user's
// memory.disk_dir itself, outside any job's directory); `machine`,
// `rank_disk_dir` and `warning` are not used.
JobEngineSetup SetUpJobEngine(const ferry::v1::JobSpec& spec, EngineUse use, const MachineFacts& machine = {},
                              const std::string& rank_disk_dir = "", std::string* warning = nullptr);

// The newest checkpoint of one step that each of world ranks 0 .. ranks - 1
// has under checkpoint.dir/rank<r> (opened beneath `roots` without following
// links where they confine), each written by this job's training (its
// TrainingFingerprint); a rank newer than another is read at the older
// step. FAILED_PRECONDITION saying what to do when the job keeps no
// checkpoints, has none yet, a rank lacks the common step, or one is of
// another training; `use` ("export", "generate") words those messages.
absl::StatusOr<std::vector<LoadedCheckpoint>> LoadJobCheckpoints(const ferry::v1::JobSpec& spec,
                                                                const AllowedRoots& roots, int ranks,
                                                                const std::string& use);

}  // namespace ferry
