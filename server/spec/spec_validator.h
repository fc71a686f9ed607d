#pragma once

// Checks a job spec before it is accepted, so a job that cannot run is
// refused at submission with a message naming the field and the fix, rather
// than failing later in a worker.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/safe_path.h"
#include "engine/memory/placement_plan.h"
#include "engine/memory/tier_plan.h"
#include "ferry/v1/spec.pb.h"

namespace ferry {

// The file system a disk tier directory is on.
struct DiskFacts {
  // The deepest part of the directory's path that exists (the directory
  // itself once it does).
  std::string existing;
  // Bytes an unprivileged process may still write there (f_bavail).
  uint64_t free_bytes = 0;
  // Mounted read-only (ST_RDONLY).
  bool read_only = false;
  // This process may create entries in `existing` (access W_OK); when not,
  // why.
  bool writable = true;
  std::string not_writable_reason;
};

// statvfs() and access(W_OK) of the deepest existing part of `dir` (an
// absolute path). FAILED_PRECONDITION with the OS's reason when even that
// cannot be examined.
absl::StatusOr<DiskFacts> ProbeDisk(const std::string& dir);

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
  // Where the disk tier's files go when the spec leaves memory.disk_dir
  // unset: for the daemon its jobs directory (each job's scratch directory
  // is made inside its own directory there), for a worker that scratch
  // directory. Empty: no disk tier unless memory.disk_dir is set.
  std::string default_disk_dir;
  // The file system of the disk tier's directory, looked at when
  // check_files is on (tests put a fake here). Unset, or with check_files
  // off, the disk's space is not known and not checked.
  std::function<absl::StatusOr<DiskFacts>(const std::string& dir)> disk = ProbeDisk;
};

// Validates a spec that has been through WithDefaults. Every problem found is
// reported, separated by "; ". The code is INVALID_ARGUMENT when any field is
// malformed or out of range, otherwise PERMISSION_DENIED when a path leads
// outside machine.allowed_roots or names a device file, FIFO or socket,
// otherwise FAILED_PRECONDITION when the machine cannot run it (a missing
// file, too little memory), otherwise UNIMPLEMENTED for a feature this build
// does not support.
absl::Status ValidateSpec(const ferry::v1::JobSpec& spec, const MachineFacts& machine);

// After WithDefaults, before ValidateSpec, where files can be read
// (machine.check_files): a model with model.init_from and architecture
// fields unset takes them from the weights file (Gpt2ConfigFromWeights);
// fields set stay as they are (ValidateSpec then checks the file against
// them). Errors: the path's (INVALID_ARGUMENT, PERMISSION_DENIED outside
// the allowed roots), FAILED_PRECONDITION for a file that is not there,
// INVALID_ARGUMENT for one that is not a GPT-2 safetensors file.
absl::Status ResolveModelFromWeights(ferry::v1::JobSpec* spec, const MachineFacts& machine);

// Bytes of model state one AdamW step needs in fp32: weights, gradients and
// two moments, 16 bytes per parameter.
uint64_t TrainingStateBytes(const ferry::v1::ModelSpec& model);

// What the tier planner is given for one rank of the job (its limits left
// 0): the chunks the chunk manager will make of the rank's parameters, laid
// out as it lays them out (memory.chunk_size, or the search with the
// model's hidden size as the step), each with its bytes of parameters,
// gradients and optimizer states in train.precision, and the model's
// values as built (4 bytes a parameter). For a spec that has been through
// WithDefaults and whose model and parallel fields are valid.
absl::StatusOr<TierInput> RankTierInput(const ferry::v1::JobSpec& spec);

// What the device plan is given for one rank of the job before any step,
// with no activations at all (non_model_bytes all 0) and `limit_bytes` the
// device may fill: the same chunks, each period's (a stage's forward or
// backward) and their bytes of parameters and gradients on the device. The
// plan with every chunk streamed is the least any step needs: a period's
// chunks' weights and the gradients being accumulated then (a tied
// embedding's from the head's backward to the embeddings'). For a spec as
// RankTierInput's.
absl::StatusOr<PlanInput> RankDevicePlanInput(const ferry::v1::JobSpec& spec, uint64_t limit_bytes);

// Host memory one rank may use for model data (MemoryOptions
// .host_budget_bytes): memory.host_budget when set; else three quarters of
// the host memory the simulated device leaves (DefaultHostBudgetBytes),
// split among the job's ranks on this machine. Checkpoints fit inside it: a
// rank snapshots its state only where the budget has room, else streams it
// to the file chunk by chunk. 0 (no limit)
// when host memory is unknown. The validator plans with it and the worker
// passes it to the engine, so both hold the job to the same figure.
uint64_t RankHostBudgetBytes(const ferry::v1::JobSpec& spec, const MachineFacts& machine);

// Bytes one rank's disk tier may take (MemoryOptions.disk_budget_bytes):
// memory.disk_budget when set, else 9/10 of `free_disk_bytes` (the free
// space of the disk tier directory's file system, DefaultDiskBudgetBytes)
// split among the job's ranks on this machine.
uint64_t RankDiskBudgetBytes(const ferry::v1::JobSpec& spec, const MachineFacts& machine,
                             uint64_t free_disk_bytes);

// The directory whose file system holds the job's disk tier:
// memory.disk_dir, else machine.default_disk_dir ("" when neither: no disk
// tier).
std::string DiskTierBase(const ferry::v1::JobSpec& spec, const MachineFacts& machine);

}  // namespace ferry
