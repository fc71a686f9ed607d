#pragma once

// Checks a job spec before it is accepted, so a job that cannot run is
// refused at submission with a message naming the field and the fix, rather
// than failing later in a worker.

#include <cstdint>

#include "absl/status/status.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// What the validator knows of the machine the job would run on.
struct MachineFacts {
  // Physical host memory; 0 skips the memory checks.
  uint64_t host_memory_bytes = 0;
  // Look at the file system (data file present and large enough). Off in the
  // CLI's local checks, on in the daemon.
  bool check_files = true;
};

// Validates a spec that has been through WithDefaults. Every problem found is
// reported, separated by "; ". The code is INVALID_ARGUMENT when any field is
// malformed or out of range, otherwise FAILED_PRECONDITION when the machine
// cannot run it (a missing file, too little memory), otherwise UNIMPLEMENTED
// for a feature this build does not support.
absl::Status ValidateSpec(const ferry::v1::JobSpec& spec, const MachineFacts& machine);

// Bytes of model state one AdamW step needs in fp32: weights, gradients and
// two moments, 16 bytes per parameter.
uint64_t TrainingStateBytes(const ferry::v1::ModelSpec& model);

}  // namespace ferry
