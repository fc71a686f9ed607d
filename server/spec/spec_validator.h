#pragma once

// Checks a job spec before it is accepted, so a job that cannot run is
// refused at submission with a message naming the field and the fix, rather
// than failing later in a worker.

#include <cstdint>

#include "absl/status/status.h"
#include "engine/common/safe_path.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// What the validator knows of the machine the job would run on.
struct MachineFacts {
  // Physical host memory; 0 skips the memory checks.
  uint64_t host_memory_bytes = 0;
  // Look at the file system (data file present and large enough; paths
  // inside allowed_roots, no device files). Off in the CLI's local checks,
  // on in the daemon.
  bool check_files = true;
  // With check_files: every path in the spec (fields marked
  // `(ferry.v1.path)`) must resolve inside one of these. Empty: anywhere.
  AllowedRoots allowed_roots;
  // The device jobs run on. device_memory_bytes: a GPU's memory (0 when
  // unknown); device_is_host_memory: the simulated device, whose budget is
  // carved out of host memory.
  uint64_t device_memory_bytes = 0;
  bool device_is_host_memory = false;
  // Every rank of a job runs on this machine (ferryd starts them all), so
  // data-parallel replicas of the model share its memory. Off for one rank
  // under a launcher, where the others may be elsewhere.
  bool ranks_share_host = false;
};

// Validates a spec that has been through WithDefaults. Every problem found is
// reported, separated by "; ". The code is INVALID_ARGUMENT when any field is
// malformed or out of range, otherwise PERMISSION_DENIED when a path leads
// outside machine.allowed_roots or names a device file, FIFO or socket,
// otherwise FAILED_PRECONDITION when the machine cannot run it (a missing
// file, too little memory), otherwise UNIMPLEMENTED for a feature this build
// does not support.
absl::Status ValidateSpec(const ferry::v1::JobSpec& spec, const MachineFacts& machine);

// Bytes of model state one AdamW step needs in fp32: weights, gradients and
// two moments, 16 bytes per parameter.
uint64_t TrainingStateBytes(const ferry::v1::ModelSpec& model);

}  // namespace ferry
