#pragma once

// Where a chunk payload's copies live, on each tier, and the memory they
// take: a device buffer whose memory comes and goes, a host buffer within
// the host budget, and for a disk-homed payload a chunk file read and
// written through the staging buffers. The chunk manager decides when a
// copy is made or dropped; this says how, and keeps the host budget.
//
// Not thread-safe: the chunk manager's training thread drives it (the disk
// store's own threads do its I/O).

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/memory/disk_store.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/memory/placement_report.h"
#include "engine/memory/tier_plan.h"

namespace ferry {

// One of a chunk's three payloads: its parameters, gradients or optimizer
// states.
struct Payload {
  PayloadKind kind = PayloadKind::kParam;
  int chunk = 0;
  int64_t numel = 0;
  c10::ScalarType dtype = c10::kFloat;
  uint64_t bytes = 0;
  // The device copy: persistent storage whose memory comes and goes.
  at::Tensor device;
  bool resident = false;
  bool device_valid = false;
  // The host copy: for a host-homed payload, allocated on first need and
  // kept while needed; for a disk-homed one, a view of a staging buffer
  // (`staging`) while it is loaded.
  at::Tensor host;
  bool host_valid = false;
  // Where its authoritative host-side copy lives, and for kDisk its file
  // and whether that holds its current values.
  Tier home = Tier::kHost;
  int disk_file = -1;
  bool disk_valid = false;
  int staging = -1;
  // The plan keeps it on the device.
  bool pinned = false;
  // Fetched ahead of its period and not used since.
  bool prefetched = false;
  // Periods that need it on the device, ascending.
  std::vector<int> uses;
};

class PayloadStore {
 public:
  // `host_budget_bytes` bounds every host buffer and staging buffer, and
  // what AddHostBytes counts beside them (0: no limit).
  PayloadStore(MemoryDevice* device, uint64_t host_budget_bytes);

  // Gives `p` its device buffer: storage that outlives its memory, pointing
  // at the device's released placeholder until Materialize.
  void InitDevice(Payload& p);
  // Device memory for the payload's device copy (stale until written), and
  // back to the placeholder.
  void Materialize(Payload& p);
  void Release(Payload& p);

  // A host-homed payload's host buffer, allocated within the host budget
  // (RESOURCE_EXHAUSTED naming memory.host_budget, as a
  // ResourceExhaustedException, past it) on first need; ReleaseHost gives it
  // back (for a disk-homed payload: detaches its staging view).
  void EnsureHost(Payload& p);
  void ReleaseHost(Payload& p);
  // Host memory for model data held outside the payloads (the model's
  // values while they move into chunks), counted against the budget.
  void AddHostBytes(int64_t bytes);
  uint64_t host_model_bytes() const { return host_model_bytes_; }
  uint64_t peak_host_model_bytes() const { return peak_host_model_bytes_; }

  // The disk tier: a chunk file for each of `on_disk` and staging buffers
  // for the largest. Their host memory counts against the budget.
  absl::Status OpenDisk(const MemoryOptions& options, const std::vector<Payload*>& on_disk);
  // Null until OpenDisk.
  DiskStore* disk() const { return disk_.get(); }
  int staging_count() const { return static_cast<int>(staging_.size()); }
  uint64_t staging_bytes() const;

  // A disk-homed payload's host side is a view of staging buffer `buffer`
  // while it is loaded: StartLoad/FinishLoad make it current there (from
  // its file, or zeros if it never held values); StartStore writes it back
  // and FinishStore waits for that and detaches it. Failures throw a
  // StatusException (DATA_LOSS for a damaged file).
  void AttachStaging(Payload& p, int buffer);
  void DetachStaging(Payload& p);
  DiskStore::Ticket StartLoad(Payload& p, int buffer);
  void FinishLoad(Payload& p, DiskStore::Ticket ticket);
  DiskStore::Ticket StartStore(Payload& p);
  void FinishStore(Payload& p, DiskStore::Ticket ticket);

  // Outside the update's pipeline, where staging buffer 0 is free: a host
  // buffer for the payload's values (its own, or for a disk-homed payload
  // that staging buffer); its values read from its file into it (LoadHome,
  // waiting); and its host values made its home's (WriteHome: for a
  // disk-homed payload, written to its file, waited for and detached; for a
  // host-homed one the host copy is its home, so nothing).
  void HostBuffer(Payload& p);
  void LoadHome(Payload& p) { FinishLoad(p, StartLoad(p, 0)); }
  void WriteHome(Payload& p);

  // Calls fn with the payload's current values: its host copy, its device
  // copy, or its disk file read into staging buffer 0 (free between steps).
  void WithCurrentCopy(const Payload& p, const std::function<void(const at::Tensor&)>& fn) const;

 private:
  void Wait(DiskStore::Ticket ticket) const;

  MemoryDevice* device_;
  uint64_t host_budget_bytes_;
  uint64_t host_model_bytes_ = 0;
  uint64_t peak_host_model_bytes_ = 0;
  // The staging buffers, then the store: the store goes first, waiting for
  // its requests, before the buffers they use.
  std::vector<AlignedBuffer> staging_;
  std::unique_ptr<DiskStore> disk_;
};

}  // namespace ferry
