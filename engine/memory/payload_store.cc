#include "engine/memory/payload_store.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/torch_status.h"
#include "engine/memory/simulated_device.h"

namespace ferry {
namespace {

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20)); }

}  // namespace

PayloadStore::PayloadStore(MemoryDevice* device, uint64_t host_budget_bytes)
    : device_(device), host_budget_bytes_(host_budget_bytes) {}

PayloadStore::~PayloadStore() {
  // Whatever was written behind lands before the files go (their results
  // no longer matter: the store is going).
  for (Slot& slot : slots_) {
    for (DiskStore::Ticket t : slot.reads) disk_->Wait(t).IgnoreError();
    for (const PendingWrite& w : slot.writes) disk_->Wait(w.ticket).IgnoreError();
  }
}

void PayloadStore::InitDevice(Payload& p) {
  const size_t bytes = static_cast<size_t>(p.numel) * c10::elementSize(p.dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, device_->ReleasedPlaceholder(bytes),
                       /*allocator=*/nullptr, /*resizable=*/false);
  p.device = at::empty({0}, at::TensorOptions().dtype(p.dtype).device(device_->compute_device()))
                 .set_(storage, 0, {p.numel}, {1});
}

void PayloadStore::Materialize(Payload& p) {
  if (p.resident) return;
  p.device.storage().unsafeGetStorageImpl()->set_data_ptr(device_->AllocateDevice(p.bytes));
  p.resident = true;
  p.device_valid = false;
}

void PayloadStore::Release(Payload& p) {
  if (!p.resident) return;
  c10::StorageImpl* storage = p.device.storage().unsafeGetStorageImpl();
  // Copies queued from or into the memory may still be running.
  device_->ReleaseAfterTransfers(storage->set_data_ptr(device_->ReleasedPlaceholder(p.bytes)), p.bytes);
  p.device_filled = TransferEvent();
  p.resident = false;
  p.device_valid = false;
  p.prefetched = false;
}

void PayloadStore::AddHostBytes(int64_t bytes) {
  host_model_bytes_ = static_cast<uint64_t>(static_cast<int64_t>(host_model_bytes_) + bytes);
  peak_host_model_bytes_ = std::max(peak_host_model_bytes_, host_model_bytes_);
}

absl::Status PayloadStore::HostRoom(uint64_t bytes, const std::string& what) const {
  if (host_budget_bytes_ == 0 || host_model_bytes_ + bytes <= host_budget_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory.host_budget: model data needs more than its ", Mib(host_budget_bytes_), " of host memory (",
      Mib(host_model_bytes_), " held, ", Mib(bytes), " more for ", what,
      "); raise memory.host_budget, give the job a disk tier (memory.disk_budget), or use a smaller model"));
}

void PayloadStore::ReserveHostBytes(uint64_t bytes, const std::string& what) {
  absl::Status room = HostRoom(bytes, what);
  if (!room.ok()) throw ResourceExhaustedException(std::string(room.message()));
  AddHostBytes(static_cast<int64_t>(bytes));
}

void PayloadStore::EnsureHost(Payload& p, bool whole) {
  const int64_t numel = whole ? p.numel : p.host_numel();
  if (p.host.defined() && p.host.numel() == numel) return;
  if (p.home == Tier::kDisk) {
    throw std::logic_error(absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind),
                                        ": a disk-homed payload has no host buffer of its own"));
  }
  ReleaseHost(p);
  ReserveHostBytes(static_cast<uint64_t>(numel) * c10::elementSize(p.dtype), absl::StrCat("chunk ", p.chunk));
  p.host = device_->AllocateHost(numel, p.dtype);
}

void PayloadStore::ReleaseHost(Payload& p) {
  p.host_valid = false;
  if (!p.host.defined()) return;
  const int64_t bytes = static_cast<int64_t>(p.host.nbytes());
  p.host = at::Tensor();
  AddHostBytes(-bytes);
}

absl::Status PayloadStore::OpenDisk(const MemoryOptions& options, const std::vector<Payload*>& on_disk,
                                    uint64_t slot_bytes) {
  if (on_disk.empty()) return absl::OkStatus();
  const uint64_t staging = kDiskStagingSlots * AlignToDisk(slot_bytes);
  if (absl::Status room = HostRoom(staging, "the disk tier's staging"); !room.ok()) return room;
  DiskStoreOptions disk;
  disk.dir = options.disk_dir;
  disk.budget_bytes = options.disk_budget_bytes;
  disk.direct_io = options.disk_direct_io;
  absl::StatusOr<std::unique_ptr<DiskStore>> store = DiskStore::Open(disk);
  if (!store.ok()) return store.status();
  disk_ = *std::move(store);
  for (Payload* p : on_disk) {
    const uint64_t bytes = DiskFileBytes(p->region_numel(), c10::elementSize(p->dtype), p->regions);
    absl::StatusOr<int> file =
        disk_->AddFile(absl::StrCat(std::string(1, PayloadKindName(p->kind)[0]), p->chunk), bytes);
    if (!file.ok()) return file.status();
    p->home = Tier::kDisk;
    p->disk_file = *file;
  }
  AddHostBytes(static_cast<int64_t>(staging));
  for (int s = 0; s < kDiskStagingSlots; ++s) slots_.push_back(Slot{AlignedBuffer(slot_bytes), {}, {}});
  return absl::OkStatus();
}

uint64_t PayloadStore::staging_bytes() const {
  uint64_t bytes = 0;
  for (const Slot& s : slots_) bytes += s.buffer.size();
  return bytes;
}

uint64_t PayloadStore::SlicePartBytes(const Payload& p) const {
  return DiskRegionBytes(p.slice_elements, c10::elementSize(p.dtype));
}

char* PayloadStore::SlotData(int slot) const {
  return static_cast<char*>(slots_.at(static_cast<size_t>(slot)).buffer.data());
}

void PayloadStore::Wait(DiskStore::Ticket ticket) const {
  absl::Status status = disk_->Wait(ticket);
  if (!status.ok()) throw StatusException(std::move(status));
}

int PayloadStore::AcquireSlot() {
  const int s = next_slot_;
  next_slot_ = (next_slot_ + 1) % static_cast<int>(slots_.size());
  Slot& slot = slots_[static_cast<size_t>(s)];
  // Reads left behind by a pipeline that stopped on an error: nobody waits
  // for their values, only for the buffer to be free.
  for (DiskStore::Ticket t : slot.reads) disk_->Wait(t).IgnoreError();
  slot.reads.clear();
  while (!slot.writes.empty()) {
    const DiskStore::Ticket t = slot.writes.back().ticket;
    slot.writes.pop_back();
    Wait(t);
  }
  return s;
}

std::vector<PayloadStore::Range> PayloadStore::SliceRanges(const Payload& p, uint64_t at, int64_t begin,
                                                           int64_t count, int region) const {
  if (p.home != Tier::kDisk || disk_ == nullptr) {
    throw std::logic_error(absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind), ": not on disk"));
  }
  const uint64_t element = c10::elementSize(p.dtype);
  const uint64_t region_bytes = DiskRegionBytes(p.region_numel(), element);
  const uint64_t part = SlicePartBytes(p);
  const int first = region >= 0 ? region : 0, last = region >= 0 ? region + 1 : p.regions;
  if (begin < 0 || count <= 0 || count > p.slice_elements || begin % kDiskSliceQuantum != 0 ||
      begin + count > p.region_numel() || at + part * static_cast<uint64_t>(last - first) > slots_.front().buffer.size()) {
    throw std::logic_error(absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind), ": slice of ", count,
                                        " elements at ", begin, " does not fit its slices or the staging slot"));
  }
  std::vector<Range> ranges;
  for (int r = first; r < last; ++r) {
    const uint64_t offset = static_cast<uint64_t>(r) * region_bytes + static_cast<uint64_t>(begin) * element;
    ranges.push_back({offset, DiskRegionBytes(count, element), at + part * static_cast<uint64_t>(r - first)});
  }
  return ranges;
}

std::vector<at::Tensor> PayloadStore::SliceViews(const Payload& p, int slot, uint64_t at, int64_t count,
                                                 int region) const {
  std::vector<at::Tensor> views;
  for (const Range& r : SliceRanges(p, at, 0, count, region)) {
    views.push_back(at::from_blob(SlotData(slot) + r.at, {count}, at::TensorOptions().dtype(p.dtype).device(at::kCPU)));
  }
  return views;
}

void PayloadStore::FinishWritesOf(const Payload* p, int64_t begin, int64_t count) {
  for (Slot& slot : slots_) {
    for (size_t i = 0; i < slot.writes.size();) {
      const PendingWrite& w = slot.writes[i];
      const bool overlaps = count <= 0 || (w.begin < begin + count && begin < w.begin + w.count);
      if ((p == nullptr || w.payload == p) && overlaps) {
        const DiskStore::Ticket t = w.ticket;
        slot.writes.erase(slot.writes.begin() + static_cast<ptrdiff_t>(i));
        Wait(t);
      } else {
        ++i;
      }
    }
  }
}

void PayloadStore::FinishWrites(const Payload* p) { FinishWritesOf(p, 0, 0); }

void PayloadStore::StartRead(const Payload& p, int slot, uint64_t at, int64_t begin, int64_t count, int region) {
  const std::vector<Range> ranges = SliceRanges(p, at, begin, count, region);
  FinishWritesOf(&p, begin, count);
  Slot& s = slots_[static_cast<size_t>(slot)];
  for (const Range& r : ranges) {
    if (p.disk_valid) {
      s.reads.push_back(disk_->ReadRange(p.disk_file, r.offset, r.bytes, SlotData(slot) + r.at));
    } else {
      // Never written: optimizer states before their first update.
      std::memset(SlotData(slot) + r.at, 0, r.bytes);
    }
  }
}

void PayloadStore::FinishReads(int slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  std::vector<DiskStore::Ticket> reads;
  reads.swap(s.reads);
  absl::Status first;
  for (DiskStore::Ticket t : reads) {
    absl::Status status = disk_->Wait(t);
    if (first.ok()) first = std::move(status);
  }
  if (!first.ok()) throw StatusException(std::move(first));
}

void PayloadStore::StartWrite(const Payload& p, int slot, uint64_t at, int64_t begin, int64_t count, int region) {
  const uint64_t element = c10::elementSize(p.dtype);
  Slot& s = slots_[static_cast<size_t>(slot)];
  for (const Range& r : SliceRanges(p, at, begin, count, region)) {
    // The file past the payload's last element holds zeros, whatever the
    // slot held there.
    const uint64_t used = static_cast<uint64_t>(count) * element;
    std::memset(SlotData(slot) + r.at + used, 0, r.bytes - used);
    s.writes.push_back({&p, begin, count, disk_->WriteRange(p.disk_file, r.offset, r.bytes, SlotData(slot) + r.at)});
  }
}

void PayloadStore::StreamIn(const Payload& p, const SliceFn& fn, int region) {
  // Reads run ahead into every slot but the one in use.
  struct InFlight {
    int64_t begin;
    int64_t count;
    int slot;
  };
  std::deque<InFlight> ahead;
  const int64_t n = p.region_numel();
  int64_t next = 0;
  auto read_ahead = [&] {
    while (next < n && ahead.size() + 1 < slots_.size()) {
      const InFlight f{next, std::min(p.slice_elements, n - next), AcquireSlot()};
      StartRead(p, f.slot, 0, f.begin, f.count, region);
      ahead.push_back(f);
      next += f.count;
    }
  };
  read_ahead();
  while (!ahead.empty()) {
    const InFlight f = ahead.front();
    ahead.pop_front();
    FinishReads(f.slot);
    fn(f.begin, f.count, SliceViews(p, f.slot, 0, f.count, region));
    read_ahead();
  }
}

void PayloadStore::StreamOut(const Payload& p, const SliceFn& fn, int region) {
  const int64_t n = p.region_numel();
  for (int64_t begin = 0; begin < n; begin += p.slice_elements) {
    const int64_t count = std::min(p.slice_elements, n - begin);
    const int slot = AcquireSlot();
    fn(begin, count, SliceViews(p, slot, 0, count, region));
    StartWrite(p, slot, 0, begin, count, region);
  }
}

}  // namespace ferry
