#pragma once

// ferry-worker --generate=REQUEST.json [--spec=JOB]: text from a job's
// newest checkpoint (with --spec) or from a GPT-2 safetensors file (the
// request's weights_path), streamed as ferry.v1.GenerateResponse frames
// (frame.h): one per token as it is produced, then the summary.

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ferry {

struct GenerateTextOptions {
  // The request, JSON (ferry.v1.GenerateRequest's mapping).
  std::string request_path;
  // The job's spec (its checkpoints), or empty for the request's
  // weights_path.
  std::string spec_path;
  // "auto", "cpu", "cuda", "cuda:N".
  std::string device = "auto";
  // Comma-separated directories every path must stay in; empty: anywhere.
  std::string allowed_roots;
  // Where the frames (ferry.internal.GenerateFrame) go, the last an error's
  // if it fails; -1 prints the text (or ids) on stdout.
  int report_fd = -1;
};

// Runs the request. FAILED_PRECONDITION, naming the field, for a job
// without checkpoint.dir or without a checkpoint yet, a tensor-parallel
// job, or a text prompt without a tokenizer; INVALID_ARGUMENT for a bad
// request or spec; PERMISSION_DENIED for a path outside the roots.
absl::Status GenerateText(const GenerateTextOptions& options);

// The command: the error on stderr; returns the exit code (2 for the
// errors above, which are the caller's to fix).
int RunGenerateText(const GenerateTextOptions& options);

}  // namespace ferry
