#pragma once

// The daemon's side of exporting a job's weights: runs
// `ferry-worker --export` for the job (a process, like training, so that the
// daemon never loads LibTorch or a model) into a file in the job's
// directory.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

struct ExportedWeights {
  // The safetensors file, or the folder; the caller deletes it.
  std::string path;
  int64_t step = 0;
  int tensors = 0;
  uint64_t bytes = 0;
  // A folder's files (names within it), in the order they are sent; empty
  // for one file.
  std::vector<std::string> files;
  std::vector<uint64_t> file_bytes;
};

// Writes the job's spec beside a new file in `job_dir` (created if
// missing), runs `worker_binary --export=FILE --spec=SPEC` and waits for it,
// polling `cancelled` (true kills it). FAILED_PRECONDITION with the worker's
// message when the job cannot be exported (no checkpoint.dir, no checkpoint
// yet...), CANCELLED, or INTERNAL with how the worker ended and the end of
// its output. `allowed_roots` (comma-separated; empty: none) goes to the
// worker, which then reads the checkpoints only beneath those directories.
// With `folder`, the worker writes a Hugging Face model folder
// (export_weights.h) and the summary lists its files.
absl::StatusOr<ExportedWeights> RunWorkerExport(const std::string& worker_binary, const std::string& job_dir,
                                                const ferry::v1::JobSpec& spec,
                                                const std::function<bool()>& cancelled,
                                                const std::string& allowed_roots = "", bool folder = false);

// Deletes what RunWorkerExport made: the file, or the folder and its files.
void RemoveExport(const ExportedWeights& exported);

// A safetensors file's summary from its header: tensors, and the step in
// its metadata. INVALID_ARGUMENT if it is not one.
absl::StatusOr<ExportedWeights> ReadSafetensorsSummary(const std::string& path);

}  // namespace ferry
