#include "server/worker/export_weights.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/model_files.h"
#include "engine/data/token_file.h"
#include "engine/model/hf_layout.h"
#include "nlohmann/json.hpp"
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
namespace {

// A file's whole contents, read beneath the allowed roots.
absl::StatusOr<std::string> ReadConfined(const AllowedRoots& roots, const std::string& field, const std::string& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenConfinedFile(roots, field, path));
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat(field, ": cannot read ", path, ": ", std::strerror(errno)));
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// The folder Hugging Face's from_pretrained loads: config.json, the weights
// (model.safetensors, or shards of at most kExportShardBytes with
// model.safetensors.index.json), generation_config.json with the model's
// end-of-sequence tokens where known (the model folder the job started
// from says them), and the files of the tokenizer the job's data was made
// with. Written into a fresh directory beside `dir`, then renamed to it.
absl::Status WriteModelFolder(std::string dir, const ferry::v1::JobSpec& spec, const ModelConfig& model,
                              const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata, const AllowedRoots& roots,
                              ExportSummary* summary) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists; export into a new folder"));
  }
  const std::string tmp = absl::StrCat(dir, ".tmp-", getpid());
  RemoveFileOrFolder(tmp);
  if (mkdir(tmp.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  auto abandon = absl::MakeCleanup([&] { RemoveFileOrFolder(tmp); });
  auto write = [&](const std::string& name, const std::string& bytes) {
    summary->bytes += bytes.size();
    ++summary->files;
    return WriteFileAtomically(tmp + "/" + name, bytes);
  };
  // Shards in the model's order, each as large as it may be.
  std::vector<std::vector<const SafetensorsTensor*>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (in_shard > 0 && in_shard + t.data.size() > kExportShardBytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.data.size();
    total += t.data.size();
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shards.size() == 1 ? "model.safetensors"
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1,
                                                                  shards.size());
    std::vector<SafetensorsTensor> part;
    for (const SafetensorsTensor* t : shards[k]) {
      part.push_back(*t);
      weight_map[t->name] = name;
    }
    std::string bytes;
    RETURN_IF_ERROR(SerializeSafetensors(part, metadata, &bytes));
    RETURN_IF_ERROR(write(name, bytes));
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    RETURN_IF_ERROR(write("model.safetensors.index.json", index.dump(2) + "\n"));
  }
  // The tokens generation starts and stops with, from the folder the job
  // started from.
  int64_t bos = -1;
  std::vector<int64_t> eos;
  const std::string& from = spec.model().init_from();
  if (!from.empty() && ModelFiles::IsFolder(from)) {
    absl::StatusOr<HfConfig> origin = ReadHfFolderConfig(from);
    if (origin.ok()) {
      bos = origin->bos_token_id;
      eos = origin->eos_token_ids;
    }
  }
  RETURN_IF_ERROR(write("config.json", HfConfigJson(model, bos, eos)));
  nlohmann::ordered_json generation = nlohmann::ordered_json::object();
  if (bos >= 0) generation["bos_token_id"] = bos;
  if (eos.size() == 1) generation["eos_token_id"] = eos[0];
  if (eos.size() > 1) generation["eos_token_id"] = eos;
  RETURN_IF_ERROR(write("generation_config.json", generation.dump(2) + "\n"));
  // The tokenizer's files, as its token file's header records them.
  if (!spec.data().has_synthetic() && !spec.data().path().empty()) {
    absl::StatusOr<UniqueFd> fd = OpenConfinedFile(roots, "data.path", spec.data().path());
    absl::StatusOr<TokenFileInfo> info =
        fd.ok() ? ReadTokenFileInfo(fd->get(), spec.data().path()) : absl::StatusOr<TokenFileInfo>(fd.status());
    if (info.ok() && info->has_header) {
      for (const std::string& file : info->tokenizer.files) {
        ASSIGN_OR_RETURN(std::string bytes, ReadConfined(roots, "data.path's tokenizer", file));
        RETURN_IF_ERROR(write(file.substr(file.rfind('/') + 1), bytes));
      }
    }
  }
  if (rename(tmp.c_str(), dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", dir, ": ", std::strerror(errno)));
  }
  std::move(abandon).Cancel();
  return absl::OkStatus();
}

}  // namespace

bool IsFolderExport(const std::string& out_path) { return !absl::EndsWith(out_path, ".safetensors"); }

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
  std::map<std::string, std::string> metadata;
  if (model.model_type == "gpt2") metadata = Gpt2ConfigMetadata(model);
  metadata["model_type"] = model.model_type;
  metadata["format"] = "pt";
  metadata["step"] = absl::StrCat(step);
  metadata["job"] = spec.name();
  metadata["source"] = "ferry";
  ExportSummary summary;
  summary.step = step;
  summary.tensors = static_cast<int>(tensors.size());
  if (IsFolderExport(out_path)) {
    RETURN_IF_ERROR(WriteModelFolder(out_path, spec, model, tensors, metadata, *roots, &summary));
    return summary;
  }
  std::string bytes;
  RETURN_IF_ERROR(SerializeSafetensors(tensors, metadata, &bytes));
  RETURN_IF_ERROR(WriteFileAtomically(out_path, bytes));
  summary.bytes = bytes.size();
  summary.files = 1;
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
  std::printf("exported %d tensors in %d files (%llu bytes) of step %lld to %s\n", summary->tensors, summary->files,
              static_cast<unsigned long long>(summary->bytes), static_cast<long long>(summary->step),
              out_path.c_str());
  return kWorkerSucceeded;
}

}  // namespace ferry
