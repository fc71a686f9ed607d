#pragma once

// Where a chunk payload's copies live, on each tier, and the memory they
// take: a device buffer whose memory comes and goes, a host buffer within
// the host budget, and for a disk-homed payload a chunk file, read and
// written through a few staging slots of host memory a slice at a time. The
// chunk manager decides when a copy is made or dropped; this says how, and
// keeps the host budget.
//
// Not thread-safe: the chunk manager's training thread drives it (the disk
// store's own threads do its I/O).

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  // Its elements as `regions` runs of region_numel() (the optimizer states:
  // the two moments, and in mixed precision the fp32 masters).
  int regions = 1;
  int64_t region_numel() const { return numel / regions; }
  // The device copy: persistent storage whose memory comes and goes.
  at::Tensor device;
  bool resident = false;
  bool device_valid = false;
  // Valid, the device copy holds every element current -- not only the
  // shard a sharded host copy filled (the rest gathered from the other
  // ranks: PlacementPolicy::Prepare).
  bool device_whole = false;
  // The host copy of a host-homed payload, allocated on first need and kept
  // while needed. A disk-homed payload has none: its values move through the
  // staging slots a slice at a time. It holds elements [host_begin,
  // host_begin + host_numel) of the device copy: all of them, or with full
  // sharding (MemoryOptions::kFull) the weights' and gradients' shard of
  // this rank -- and, where gradients not yet reduced must leave the device,
  // all of them for a while (host.numel() says which).
  at::Tensor host;
  bool host_valid = false;
  int64_t host_begin = 0;
  int64_t host_count = 0;  // 0: numel
  int64_t host_numel() const { return host_count > 0 ? host_count : numel; }
  bool host_sharded() const { return host_numel() != numel; }
  uint64_t host_bytes() const { return static_cast<uint64_t>(host_numel()) * c10::elementSize(dtype); }
  // The part of `device` (the device copy, or a tensor laid out as it is)
  // that the host copy as allocated now holds.
  at::Tensor HostPart(const at::Tensor& whole) const {
    return host.defined() && host.numel() == numel ? whole : whole.narrow(0, host_begin, host_numel());
  }
  // Where its authoritative host-side copy lives; for kDisk its file,
  // whether that holds its current values (once the writes queued to it
  // land), and the elements of a slice of it.
  Tier home = Tier::kHost;
  int disk_file = -1;
  bool disk_valid = false;
  int64_t slice_elements = 0;
  // The plan keeps it on the device.
  bool pinned = false;
  // Fetched ahead of its period and not used since.
  bool prefetched = false;
  // The copy engine's last copy into the device copy (compute waits for it
  // before reading it) and into the host copy (a copy out of the host copy
  // waits for it).
  TransferEvent device_filled;
  TransferEvent host_filled;
  // Periods that need it on the device, ascending.
  std::vector<int> uses;
};

class PayloadStore {
 public:
  // `host_budget_bytes` bounds every host buffer and staging slot, and what
  // AddHostBytes counts beside them (0: no limit).
  PayloadStore(MemoryDevice* device, uint64_t host_budget_bytes);
  // Waits for the disk writes in flight.
  ~PayloadStore();

  // Gives `p` its device buffer: storage that outlives its memory, pointing
  // at the device's released placeholder until Materialize.
  void InitDevice(Payload& p);
  // Device memory for the payload's device copy (stale until written), and
  // back to the placeholder.
  void Materialize(Payload& p);
  void Release(Payload& p);

  // A host-homed payload's host buffer, allocated within the host budget
  // (RESOURCE_EXHAUSTED naming memory.host_budget, as a
  // ResourceExhaustedException, past it) on first need: its host_numel
  // elements, or with `whole` all of them (a buffer of the other size is
  // given back first, its values with it); ReleaseHost gives it back (for a
  // disk-homed payload, which has none, it only marks the host side stale).
  void EnsureHost(Payload& p, bool whole = false);
  void ReleaseHost(Payload& p);
  // Host memory for model data held outside the payloads (the model's
  // values while they move into chunks), counted against the budget; and
  // the same as a scope, for memory held while it lives.
  void AddHostBytes(int64_t bytes);
  uint64_t host_model_bytes() const { return host_model_bytes_; }
  uint64_t peak_host_model_bytes() const { return peak_host_model_bytes_; }
  // Like EnsureHost's check: throws a ResourceExhaustedException naming
  // memory.host_budget if `bytes` more would pass it, else counts them.
  void ReserveHostBytes(uint64_t bytes, const std::string& what);

  // The disk tier: a chunk file for each of `on_disk` (whose
  // slice_elements are set) and kDiskStagingSlots staging slots of
  // `slot_bytes`. Their host memory counts against the budget
  // (RESOURCE_EXHAUSTED past it).
  absl::Status OpenDisk(const MemoryOptions& options, const std::vector<Payload*>& on_disk, uint64_t slot_bytes);
  // Null until OpenDisk.
  DiskStore* disk() const { return disk_.get(); }
  uint64_t staging_bytes() const;

  // --- Slices of disk-homed payloads, through the staging slots. ---
  // A slice of a payload is elements [begin, begin + count) of each of its
  // regions (or of `region` alone, when it is >= 0): begin a multiple of
  // kDiskSliceQuantum (of its slice_elements, but where a shard starts), count
  // at most its slice_elements. In a slot it takes its regions'
  // parts one after another from byte `at`, each SlicePartBytes long.
  uint64_t SlicePartBytes(const Payload& p) const;
  // The next staging slot, round robin, once what was queued from or into
  // it is done (a failed write throws a StatusException).
  int AcquireSlot();
  // Views of a slice in `slot`: one per region (one for `region` >= 0).
  std::vector<at::Tensor> SliceViews(const Payload& p, int slot, uint64_t at, int64_t count, int region = -1) const;
  // Queues the read of a slice into `slot` (after any write of it still in
  // flight); for a payload whose file holds no values yet (!disk_valid),
  // zeros instead. FinishReads waits for the slot's reads and checks them
  // (a StatusException: DATA_LOSS for a damaged file).
  void StartRead(const Payload& p, int slot, uint64_t at, int64_t begin, int64_t count, int region = -1);
  void FinishReads(int slot);
  // Queues the write of a slice from `slot`: done before the slot is used
  // again, or by FinishWrites. The caller says when the file holds the
  // payload's values (disk_valid).
  void StartWrite(const Payload& p, int slot, uint64_t at, int64_t begin, int64_t count, int region = -1);
  // Waits for the writes in flight of `p` (null: of every payload).
  void FinishWrites(const Payload* p = nullptr);

  // A whole disk-homed payload (or one region of it) a slice at a time.
  // StreamIn reads ahead and calls `fn` with each slice's views once read;
  // StreamOut calls `fn` to fill each slice's views, then writes it behind
  // (the caller says when the file holds the payload's values).
  using SliceFn = std::function<void(int64_t begin, int64_t count, const std::vector<at::Tensor>& views)>;
  void StreamIn(const Payload& p, const SliceFn& fn, int region = -1);
  void StreamOut(const Payload& p, const SliceFn& fn, int region = -1);

 private:
  struct PendingWrite {
    const Payload* payload;
    int64_t begin;
    int64_t count;
    DiskStore::Ticket ticket;
  };
  struct Slot {
    AlignedBuffer buffer;
    std::vector<DiskStore::Ticket> reads;
    std::vector<PendingWrite> writes;
  };
  // The file ranges of a slice: per region, its byte offset, length, and the
  // slot byte its part starts at.
  struct Range {
    uint64_t offset;
    uint64_t bytes;
    uint64_t at;
  };
  std::vector<Range> SliceRanges(const Payload& p, uint64_t at, int64_t begin, int64_t count, int region) const;
  // RESOURCE_EXHAUSTED naming memory.host_budget if `bytes` more for `what`
  // would pass it.
  absl::Status HostRoom(uint64_t bytes, const std::string& what) const;
  char* SlotData(int slot) const;
  void Wait(DiskStore::Ticket ticket) const;
  // Waits for the writes of `p` (all, or those overlapping [begin, begin +
  // count) when count > 0).
  void FinishWritesOf(const Payload* p, int64_t begin, int64_t count);

  MemoryDevice* device_;
  uint64_t host_budget_bytes_;
  uint64_t host_model_bytes_ = 0;
  uint64_t peak_host_model_bytes_ = 0;
  // The staging slots, then the store: the store goes first, waiting for its
  // requests, before the buffers they use.
  std::vector<Slot> slots_;
  int next_slot_ = 0;
  std::unique_ptr<DiskStore> disk_;
};

}  // namespace ferry
