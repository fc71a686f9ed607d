#pragma once

// Job files: YAML (or JSON) in the JSON mapping of ferry.v1.JobSpec.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// Parses a job file's text. Relative paths in it resolve against `base_dir`;
// `overrides` are `field.path=value` assignments applied on top (relative
// paths in them resolve against `cwd`).
absl::StatusOr<ferry::v1::JobSpec> ParseJobSpec(absl::string_view text,
                                                absl::string_view base_dir,
                                                const std::vector<std::string>& overrides = {},
                                                absl::string_view cwd = "");

// Reads and parses the job file at `path`; relative paths in it resolve
// against the file's directory, those in `overrides` against the current
// directory. Errors start with the file's path.
absl::StatusOr<ferry::v1::JobSpec> LoadJobFile(const std::string& path,
                                               const std::vector<std::string>& overrides = {});

}  // namespace ferry
