// Fuzzes the job-file reader (YAML text -> JobSpec), then defaults and
// validation (spec_checks.h). Any input must give a spec or an error: no
// crash, no exception, no hang.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/spec/job_file.h"
#include "tests/fuzz/spec_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ferry::v1::JobSpec> spec = ferry::ParseJobSpec(text, "/jobs/base");
  if (spec.ok()) ferry::fuzz::CheckSpec(*spec);
  // The same text as one --set override's value, as the CLI applies them.
  const std::vector<std::string> overrides = {"model=" + std::string(text)};
  spec = ferry::ParseJobSpec("data: {synthetic: {}}", "/jobs/base", overrides, "/cwd");
  if (spec.ok()) ferry::fuzz::CheckSpec(*spec);
  return 0;
}
