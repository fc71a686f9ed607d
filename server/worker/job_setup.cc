#include "server/worker/job_setup.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/worker/training_fingerprint.h"

namespace ferry {

absl::StatusOr<ferry::v1::JobSpec> LoadCheckedJobFile(const std::string& path) {
  ASSIGN_OR_RETURN(ferry::v1::JobSpec parsed, LoadJobFile(path));
  ASSIGN_OR_RETURN(ferry::v1::JobSpec spec, WithDefaults(parsed));
  MachineFacts machine;
  machine.check_files = false;
  RETURN_IF_ERROR(ValidateSpec(spec, machine));
  return spec;
}

JobEngineSetup SetUpJobEngine(const ferry::v1::JobSpec& spec, EngineUse use, const MachineFacts& machine,
                              const std::string& rank_disk_dir, std::string* warning) {
  JobEngineSetup setup;
  setup.model = ToModelConfig(spec.model());
  setup.train = ToTrainOptions(spec.train());
  setup.memory = ToMemoryOptions(spec);
  MemoryOptions& memory = setup.memory;
  if (use == EngineUse::kRead) {
    memory.host_budget_bytes = 0;
    memory.disk_dir.clear();
    memory.disk_budget_bytes = 0;
    return setup;
  }
  memory.host_budget_bytes = RankHostBudgetBytes(spec, machine);
  memory.disk_dir = rank_disk_dir;
  memory.disk_direct_io = true;
  memory.disk_budget_bytes = 0;
  if (rank_disk_dir.empty()) return setup;
  if (spec.memory().disk_budget() > 0) {
    memory.disk_budget_bytes = spec.memory().disk_budget();
    return setup;
  }
  absl::StatusOr<DiskFacts> facts =
      machine.disk ? machine.disk(rank_disk_dir) : absl::UnavailableError("the machine's disks are not looked at");
  if (facts.ok()) {
    memory.disk_budget_bytes = RankDiskBudgetBytes(spec, machine, facts->free_bytes);
  } else if (warning != nullptr) {
    *warning = absl::StrCat("disk tier: off, its free space is unknown: ", facts.status().message());
  }
  return setup;
}

absl::StatusOr<std::vector<LoadedCheckpoint>> LoadJobCheckpoints(const ferry::v1::JobSpec& spec,
                                                                const AllowedRoots& roots, int ranks,
                                                                const std::string& use) {
  const ferry::v1::CheckpointSpec& checkpoint = spec.checkpoint();
  if (checkpoint.dir().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: job '", spec.name(), "' keeps no checkpoints, so there are no trained weights to ", use,
        "; set checkpoint.dir (and checkpoint.every_steps) in its job file and train it"));
  }
  const std::string fingerprint = TrainingFingerprint(spec);
  // Under allowed roots each rank's directory is opened beneath its root
  // without following links, and read through that descriptor.
  std::vector<std::shared_ptr<UniqueFd>> root_fds(static_cast<size_t>(std::max(ranks, 0)));
  auto root_of = [&](int r) { return absl::StrCat(checkpoint.dir(), "/rank", r); };
  if (roots.confined()) {
    for (int r = 0; r < ranks; ++r) {
      absl::StatusOr<UniqueFd> fd = OpenConfinedDir(roots, "checkpoint.dir", root_of(r), /*create=*/false);
      if (absl::IsNotFound(fd.status())) continue;  // no checkpoint yet: said below
      if (!fd.ok()) return fd.status();
      root_fds[static_cast<size_t>(r)] = std::make_shared<UniqueFd>(*std::move(fd));
    }
  }
  auto load_latest = [&](int r) -> absl::StatusOr<LoadedCheckpoint> {
    if (!roots.confined()) return LoadLatestCheckpoint(root_of(r));
    const std::shared_ptr<UniqueFd>& fd = root_fds[static_cast<size_t>(r)];
    if (fd == nullptr) return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", root_of(r)));
    return LoadLatestCheckpointIn(fd->get(), root_of(r));
  };
  auto load_at = [&](int r, int64_t at) -> absl::StatusOr<LoadedCheckpoint> {
    if (!roots.confined()) return LoadCheckpointAt(root_of(r), at);
    const std::shared_ptr<UniqueFd>& fd = root_fds[static_cast<size_t>(r)];
    if (fd == nullptr) return absl::NotFoundError(absl::StrCat("no checkpoint of step ", at, " in ", root_of(r)));
    return LoadCheckpointIn(fd->get(), root_of(r), at);
  };
  std::vector<LoadedCheckpoint> loaded;
  int64_t step = -1;
  for (int r = 0; r < ranks; ++r) {
    absl::StatusOr<LoadedCheckpoint> newest = load_latest(r);
    if (absl::IsNotFound(newest.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: no checkpoint yet (", newest.status().message(), "); the job writes one every ",
          checkpoint.every_steps(), " steps (checkpoint.every_steps) and after its last; ", use, " after that"));
    }
    if (!newest.ok()) return newest.status();
    if (newest->contents.meta["training"] != fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: ", root_of(r), " holds a checkpoint of another training (the model, data, train or ",
          "parallel settings differ from this job's)"));
    }
    step = r == 0 ? newest->contents.step : std::min(step, newest->contents.step);
    loaded.push_back(*std::move(newest));
  }
  // A rank that has written a newer step than another (training goes on):
  // take the newest step every rank has.
  for (int r = 0; r < ranks; ++r) {
    LoadedCheckpoint& c = loaded[static_cast<size_t>(r)];
    if (c.contents.step == step) continue;
    absl::StatusOr<LoadedCheckpoint> older = load_at(r, step);
    if (!older.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: the ranks' newest checkpoints are of different steps and rank ", r,
          " has no usable one of step ", step, " (", older.status().message(), "); ", use, " again after the next ",
          "checkpoint"));
    }
    c = *std::move(older);
  }
  return loaded;
}

}  // namespace ferry
