#pragma once

// ferry-worker --export=OUT --spec=JOB: the job's latest weights in its
// family's Hugging Face layout (engine/train/hf_export.h), from the newest
// checkpoint under its checkpoint.dir that verifies: one safetensors file
// (OUT ending in .safetensors), or a model folder that Hugging Face's
// from_pretrained loads (config.json, the weights in shards of at most 5 GB
// with their index, generation_config.json, the job's tokenizer files).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ferry {

struct ExportSummary {
  int64_t step = 0;
  int tensors = 0;
  int files = 0;
  uint64_t bytes = 0;
};

// The largest weights file of a folder export (Hugging Face's default
// max_shard_size, 5 GB): larger models are written as shards with an index.
inline constexpr uint64_t kExportShardBytes = 5000000000ull;

// Whether `out_path` asks for a Hugging Face model folder (anything not
// ending in .safetensors) rather than one file.
bool IsFolderExport(const std::string& out_path);

// Writes `out_path` atomically (a temporary file or folder beside it, then
// renamed; a folder that exists already is refused). The header's __metadata__ holds format "pt", the step, the job's
// name and GPT-2's configuration names. FAILED_PRECONDITION, naming the
// field, for a job without checkpoint.dir, without a checkpoint yet, or
// whose checkpoints are of another training; INVALID_ARGUMENT for a spec
// that does not load.
// `allowed_roots` (comma-separated; empty: none): checkpoints are read
// only beneath these directories, never through a link.
absl::StatusOr<ExportSummary> ExportWeights(const std::string& spec_path, const std::string& out_path,
                                            const std::string& allowed_roots = "");

// The command: prints a one-line summary on stdout or the error on stderr;
// returns the exit code (2 for bad usage: a bad spec, no checkpoint.dir, no
// checkpoint yet, another training's checkpoints).
int RunExportWeights(const std::string& spec_path, const std::string& out_path,
                     const std::string& allowed_roots = "");

}  // namespace ferry
