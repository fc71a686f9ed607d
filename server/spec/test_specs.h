#pragma once

// Job specs for tests: parsed from YAML and given their defaults, as the
// daemon takes them.

#include <gtest/gtest.h>

#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/spec.pb.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"

namespace ferry::testing {

// `yaml` (paths relative to /base) with every default filled; a parse or
// defaults error fails the test.
inline ferry::v1::JobSpec ResolvedSpec(const std::string& yaml) {
  absl::StatusOr<ferry::v1::JobSpec> parsed = ParseJobSpec(yaml, "/base");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return {};
  absl::StatusOr<ferry::v1::JobSpec> resolved = WithDefaults(*parsed);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved.ok() ? *resolved : ferry::v1::JobSpec();
}

}  // namespace ferry::testing
