#pragma once

// A Generate request's own fields, checked where they arrive (the daemon)
// and again where they are used (ferry-worker --generate). No LibTorch.

#include <cstdint>

#include "absl/status/status.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

// The most tokens one request may generate, and what an unset max_tokens
// means.
inline constexpr uint32_t kMaxGenerateTokens = 4096;
inline constexpr uint32_t kDefaultGenerateTokens = 64;

// No files read: a model (job_id or an absolute weights_path), exactly one
// of prompt and prompt_ids, max_tokens in 1 .. kMaxGenerateTokens,
// temperature >= 0, top_p in (0, 1], a tokenizer kind that exists with its
// files (absolute paths), given only with weights_path. INVALID_ARGUMENT
// naming the field and what to change.
absl::Status ValidateGenerateRequest(const ferry::v1::GenerateRequest& request);

}  // namespace ferry
