#pragma once

// What every job spec the fuzzers reach must satisfy, whatever its origin
// (a YAML job file, or the JobSpec message of a Submit call): filling in
// defaults and validating never crash; WithDefaults is idempotent; and a spec
// the daemon accepts reads back unchanged in the worker, which gets it as
// the JSON the daemon writes (server/worker/process_executor.cc) and reads it
// with the job-file reader.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ferry/v1/spec.pb.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/spec_validator.h"

namespace ferry::fuzz {

[[noreturn]] inline void Fail(const char* what, const ferry::v1::JobSpec& spec,
                              const std::string& detail = "") {
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s\nspec: %s\n%s\n", what, spec.ShortDebugString().c_str(),
               detail.c_str());
  std::abort();
}

// Field by field, a NaN equal to a NaN: a spec may carry one (refused by
// the validator, not by WithDefaults).
inline bool Same(const ferry::v1::JobSpec& a, const ferry::v1::JobSpec& b) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  return differencer.Compare(a, b);
}

inline void CheckSpec(const ferry::v1::JobSpec& parsed) {
  absl::StatusOr<ferry::v1::JobSpec> spec = WithDefaults(parsed);
  if (!spec.ok()) return;
  absl::StatusOr<ferry::v1::JobSpec> again = WithDefaults(*spec);
  if (!again.ok() || !Same(*again, *spec)) {
    Fail("WithDefaults is not idempotent", *spec, again.ok() ? "" : again.status().ToString());
  }
  MachineFacts machine;
  machine.host_memory_bytes = uint64_t{16} << 30;
  machine.check_files = false;
  const absl::Status valid = ValidateSpec(*spec, machine);
  if (!valid.ok()) {
    if (valid.message().empty()) Fail("a refusal without a message", *spec);
    return;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(*spec, &json, print).ok()) {
    Fail("an accepted spec has no JSON form", *spec);
  }
  absl::StatusOr<ferry::v1::JobSpec> back = ParseJobSpec(json, "");
  if (!back.ok()) Fail("the worker cannot read an accepted spec", *spec, back.status().ToString() + "\n" + json);
  // Fields this build does not know (from a newer client) have no JSON form.
  spec->DiscardUnknownFields();
  if (!Same(*back, *spec)) {
    Fail("an accepted spec reads back changed", *spec, back->ShortDebugString() + "\n" + json);
  }
}

}  // namespace ferry::fuzz
