#include "server/worker/export_weights.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/model_files.h"
#include "engine/data/token_file.h"
#include "engine/model/gpt2_weights.h"
#include "engine/model/hf_layout.h"
#include "nlohmann/json.hpp"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/common/safe_path.h"
#include "engine/common/status_macros.h"
#include "engine/memory/simulated_device.h"
#include "engine/train/hf_export.h"
#include "server/common/files.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/spec_validator.h"
#include "server/worker/job_setup.h"
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
// The weights come from `export_to`, which hands each tensor to the sink it
// is given as it is produced; they are written straight into their shard.
absl::Status WriteModelFolder(std::string dir, const ferry::v1::JobSpec& spec, const ModelConfig& model,
                              const std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata, const AllowedRoots& roots,
                              const std::function<absl::Status(const HfTensorSink&)>& export_to,
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
  std::vector<std::vector<SafetensorsEntry>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const SafetensorsEntry& t : tensors) {
    if (in_shard > 0 && in_shard + t.bytes > kExportShardBytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes;
    total += t.bytes;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::vector<SafetensorsFileWriter> writers;
  std::map<std::string, SafetensorsFileWriter*> writer_of;
  writers.reserve(shards.size());
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shards.size() == 1 ? "model.safetensors"
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1,
                                                                  shards.size());
    for (const SafetensorsEntry& t : shards[k]) weight_map[t.name] = name;
    ASSIGN_OR_RETURN(SafetensorsFileWriter writer, SafetensorsFileWriter::Create(tmp + "/" + name, shards[k], metadata));
    writers.push_back(std::move(writer));
    for (const SafetensorsEntry& t : shards[k]) writer_of[t.name] = &writers.back();
  }
  RETURN_IF_ERROR(export_to([&](const std::string& name, const void* data, uint64_t bytes) -> absl::Status {
    const auto w = writer_of.find(name);
    if (w == writer_of.end()) return absl::InternalError(absl::StrCat("export: no file for ", name));
    return w->second->Write(name, data, bytes);
  }));
  for (SafetensorsFileWriter& w : writers) {
    RETURN_IF_ERROR(w.Finish());
    summary->bytes += w.file_bytes();
    ++summary->files;
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
  ASSIGN_OR_RETURN(ferry::v1::JobSpec spec, LoadCheckedJobFile(spec_path));
  // The chunks are restored once and read out, not trained.
  const JobEngineSetup setup = SetUpJobEngine(spec, EngineUse::kRead);
  // Tensor rank t of data rank d is world rank d * tensor + t: one
  // checkpoint per tensor rank, all of one step, of data rank 0 alone
  // unless the job shards its chunks across its data ranks (each then holds
  // its own shard of the masters, joined here).
  const int tensor = static_cast<int>(std::max<uint32_t>(1, spec.parallel().tensor()));
  const int data =
      setup.memory.shard != MemoryOptions::Shard::kNone ? static_cast<int>(spec.parallel().data()) : 1;
  ASSIGN_OR_RETURN(std::vector<LoadedCheckpoint> ranks, LoadJobCheckpoints(spec, *roots, tensor * data, "export"));
  const int64_t step = ranks[0].contents.step;
  std::vector<const CheckpointContents*> contents;
  for (const LoadedCheckpoint& c : ranks) contents.push_back(&c.contents);
  // Nothing goes onto the device: the chunks' host copies hold the values.
  SimulatedDevice device(uint64_t{1} << 30);
  const ModelConfig& model = setup.model;
  std::map<std::string, std::string> metadata;
  if (model.model_type == "gpt2") metadata = Gpt2ConfigMetadata(model);
  metadata["model_type"] = model.model_type;
  metadata["format"] = "pt";
  metadata["step"] = absl::StrCat(step);
  metadata["job"] = spec.name();
  metadata["source"] = "ferry";
  // Each tensor goes into its file as it is produced: no more than one is
  // held beside the restored chunks.
  const std::vector<SafetensorsEntry> tensors = HfExportEntries(model);
  auto export_to = [&](const HfTensorSink& sink) {
    return ExportHfWeights(model, setup.train, setup.memory, contents, &device, data, sink);
  };
  ExportSummary summary;
  summary.step = step;
  summary.tensors = static_cast<int>(tensors.size());
  if (IsFolderExport(out_path)) {
    RETURN_IF_ERROR(WriteModelFolder(out_path, spec, model, tensors, metadata, *roots, export_to, &summary));
    return summary;
  }
  ASSIGN_OR_RETURN(SafetensorsFileWriter writer, SafetensorsFileWriter::Create(out_path, tensors, metadata));
  RETURN_IF_ERROR(export_to([&](const std::string& name, const void* data, uint64_t bytes) {
    return writer.Write(name, data, bytes);
  }));
  RETURN_IF_ERROR(writer.Finish());
  summary.bytes = writer.file_bytes();
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
