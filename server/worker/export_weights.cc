#include "server/worker/export_weights.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/common/safe_path.h"
#include "engine/common/status_macros.h"
#include "engine/memory/simulated_device.h"
#include "engine/train/gpt2_export.h"
#include "server/common/files.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/spec_validator.h"
#include "server/worker/training_fingerprint.h"
#include "server/worker/worker.h"

namespace ferry {

absl::StatusOr<ExportSummary> ExportWeights(const std::string& spec_path, const std::string& out_path,
                                            const std::string& allowed_roots) {
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(allowed_roots);
  if (!roots.ok()) return absl::InvalidArgumentError(absl::StrCat("--allowed_roots: ", roots.status().message()));
  ASSIGN_OR_RETURN(ferry::v1::JobSpec parsed, LoadJobFile(spec_path));
  ASSIGN_OR_RETURN(ferry::v1::JobSpec spec, WithDefaults(parsed));
  MachineFacts machine;
  machine.check_files = false;  // the data is not read
  RETURN_IF_ERROR(ValidateSpec(spec, machine));
  const ferry::v1::CheckpointSpec& checkpoint = spec.checkpoint();
  if (checkpoint.dir().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir: job '", spec.name(), "' keeps no checkpoints, so there are no weights to export; set "
        "checkpoint.dir (and checkpoint.every_steps) in its job file and train it"));
  }
  // Tensor rank t of data rank d is world rank d * tensor + t: one
  // checkpoint per tensor rank, all of one step, of data rank 0 alone
  // unless the job shards its chunks across its data ranks (each then holds
  // its own shard of the masters, joined here).
  const int tensor = static_cast<int>(std::max<uint32_t>(1, spec.parallel().tensor()));
  MemoryOptions memory = ToMemoryOptions(spec);
  const int data = memory.shard != MemoryOptions::Shard::kNone ? static_cast<int>(spec.parallel().data()) : 1;
  const int world = tensor * data;
  const std::string fingerprint = TrainingFingerprint(spec);
  // Under allowed roots each rank's directory is opened beneath its root
  // without following links, and read through that descriptor.
  std::vector<std::shared_ptr<UniqueFd>> root_fds(static_cast<size_t>(world));
  if (roots->confined()) {
    for (int r = 0; r < world; ++r) {
      const std::string root = absl::StrCat(checkpoint.dir(), "/rank", r);
      absl::StatusOr<UniqueFd> fd = OpenConfinedDir(*roots, "checkpoint.dir", root, /*create=*/false);
      if (absl::IsNotFound(fd.status())) continue;  // no checkpoint yet: said below
      if (!fd.ok()) return fd.status();
      root_fds[static_cast<size_t>(r)] = std::make_shared<UniqueFd>(*std::move(fd));
    }
  }
  auto load_latest = [&](int r, const std::string& root) -> absl::StatusOr<LoadedCheckpoint> {
    if (!roots->confined()) return LoadLatestCheckpoint(root);
    const std::shared_ptr<UniqueFd>& fd = root_fds[static_cast<size_t>(r)];
    if (fd == nullptr) return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", root));
    return LoadLatestCheckpointIn(fd->get(), root);
  };
  auto load_at = [&](int r, const std::string& root, int64_t at) -> absl::StatusOr<LoadedCheckpoint> {
    if (!roots->confined()) return LoadCheckpointAt(root, at);
    const std::shared_ptr<UniqueFd>& fd = root_fds[static_cast<size_t>(r)];
    if (fd == nullptr) return absl::NotFoundError(absl::StrCat("no checkpoint of step ", at, " in ", root));
    return LoadCheckpointIn(fd->get(), root, at);
  };
  std::vector<LoadedCheckpoint> ranks;
  int64_t step = -1;
  for (int r = 0; r < world; ++r) {
    const std::string root = absl::StrCat(checkpoint.dir(), "/rank", r);
    absl::StatusOr<LoadedCheckpoint> loaded = load_latest(r, root);
    if (absl::IsNotFound(loaded.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: no checkpoint yet (", loaded.status().message(), "); the job writes one every ",
          checkpoint.every_steps(), " steps (checkpoint.every_steps) and after its last; export after that"));
    }
    if (!loaded.ok()) return loaded.status();
    if (loaded->contents.meta["training"] != fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: ", root, " holds a checkpoint of another training (the model, data, train or ",
          "parallel settings differ from this job's)"));
    }
    step = r == 0 ? loaded->contents.step : std::min(step, loaded->contents.step);
    ranks.push_back(*std::move(loaded));
  }
  // A rank that has written a newer step than another (training goes on):
  // take the newest step every rank has.
  for (int r = 0; r < world; ++r) {
    LoadedCheckpoint& c = ranks[static_cast<size_t>(r)];
    if (c.contents.step == step) continue;
    absl::StatusOr<LoadedCheckpoint> older = load_at(r, absl::StrCat(checkpoint.dir(), "/rank", r), step);
    if (!older.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: the ranks' newest checkpoints are of different steps and rank ", r,
          " has no usable one of step ", step, " (", older.status().message(), "); export again after the next ",
          "checkpoint"));
    }
    c = *std::move(older);
  }
  std::vector<const CheckpointContents*> contents;
  for (const LoadedCheckpoint& c : ranks) contents.push_back(&c.contents);
  // Nothing goes onto the device: the chunks' host copies hold the values.
  SimulatedDevice device(uint64_t{1} << 30);
  const ModelConfig model = ToModelConfig(spec.model());
  // The chunks are restored once and read out, not trained: no host budget
  // to plan within and no disk tier (whose files would land in the user's
  // memory.disk_dir itself, outside any job's directory).
  memory.host_budget_bytes = 0;
  memory.disk_dir.clear();
  memory.disk_budget_bytes = 0;
  ASSIGN_OR_RETURN(std::vector<SafetensorsTensor> tensors,
                   ExportHfWeights(model, ToTrainOptions(spec.train()), memory, contents, &device, data));
  std::map<std::string, std::string> metadata = Gpt2ConfigMetadata(model);
  metadata["format"] = "pt";
  metadata["step"] = absl::StrCat(step);
  metadata["job"] = spec.name();
  metadata["source"] = "ferry";
  std::string bytes;
  RETURN_IF_ERROR(SerializeSafetensors(tensors, metadata, &bytes));
  RETURN_IF_ERROR(WriteFileAtomically(out_path, bytes));
  ExportSummary summary;
  summary.step = step;
  summary.tensors = static_cast<int>(tensors.size());
  summary.bytes = bytes.size();
  return summary;
}

int RunExportWeights(const std::string& spec_path, const std::string& out_path, const std::string& allowed_roots) {
  absl::StatusOr<ExportSummary> summary = ExportWeights(spec_path, out_path, allowed_roots);
  if (!summary.ok()) {
    std::fprintf(stderr, "ferry-worker: %s\n", std::string(summary.status().message()).c_str());
    const absl::StatusCode code = summary.status().code();
    return code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kPermissionDenied
               ? kWorkerBadUsage
               : kWorkerFailed;
  }
  std::printf("exported %d tensors (%llu bytes) of step %lld to %s\n", summary->tensors,
              static_cast<unsigned long long>(summary->bytes), static_cast<long long>(summary->step),
              out_path.c_str());
  return kWorkerSucceeded;
}

}  // namespace ferry
