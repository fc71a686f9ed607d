#include "engine/memory/payload_store.h"

#include <ATen/ATen.h>

#include <algorithm>
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
  device_->RecordTransferUse(storage->data_ptr());
  storage->set_data_ptr(device_->ReleasedPlaceholder(p.bytes));
  p.resident = false;
  p.device_valid = false;
  p.prefetched = false;
}

void PayloadStore::AddHostBytes(int64_t bytes) {
  host_model_bytes_ = static_cast<uint64_t>(static_cast<int64_t>(host_model_bytes_) + bytes);
  peak_host_model_bytes_ = std::max(peak_host_model_bytes_, host_model_bytes_);
}

void PayloadStore::EnsureHost(Payload& p) {
  if (p.host.defined()) return;
  if (p.home == Tier::kDisk) {
    throw std::logic_error(absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind),
                                        ": a disk-homed payload has no host buffer of its own"));
  }
  if (host_budget_bytes_ > 0 && host_model_bytes_ + p.bytes > host_budget_bytes_) {
    throw ResourceExhaustedException(absl::StrCat(
        "memory.host_budget: model data needs more than its ", Mib(host_budget_bytes_), " of host memory (",
        Mib(host_model_bytes_), " held, ", Mib(p.bytes), " more for chunk ", p.chunk,
        "); raise memory.host_budget, give the job a disk tier (memory.disk_budget), or use a smaller model"));
  }
  p.host = device_->AllocateHost(p.numel, p.dtype);
  AddHostBytes(static_cast<int64_t>(p.bytes));
}

void PayloadStore::ReleaseHost(Payload& p) {
  if (p.home == Tier::kDisk) {
    DetachStaging(p);
    return;
  }
  p.host_valid = false;
  if (!p.host.defined()) return;
  p.host = at::Tensor();
  AddHostBytes(-static_cast<int64_t>(p.bytes));
}

absl::Status PayloadStore::OpenDisk(const MemoryOptions& options, const std::vector<Payload*>& on_disk) {
  uint64_t largest = 0;
  for (const Payload* p : on_disk) largest = std::max(largest, p->bytes);
  if (largest == 0) return absl::OkStatus();
  DiskStoreOptions disk;
  disk.dir = options.disk_dir;
  disk.budget_bytes = options.disk_budget_bytes;
  disk.direct_io = options.disk_direct_io;
  absl::StatusOr<std::unique_ptr<DiskStore>> store = DiskStore::Open(disk);
  if (!store.ok()) return store.status();
  disk_ = *std::move(store);
  for (Payload* p : on_disk) {
    absl::StatusOr<int> file =
        disk_->AddFile(absl::StrCat(std::string(1, PayloadKindName(p->kind)[0]), p->chunk), p->bytes);
    if (!file.ok()) return file.status();
    p->home = Tier::kDisk;
    p->disk_file = *file;
  }
  for (int b = 0; b < kDiskStagingBuffers; ++b) {
    staging_.emplace_back(largest);
    AddHostBytes(static_cast<int64_t>(staging_.back().size()));
  }
  return absl::OkStatus();
}

uint64_t PayloadStore::staging_bytes() const {
  uint64_t bytes = 0;
  for (const AlignedBuffer& b : staging_) bytes += b.size();
  return bytes;
}

void PayloadStore::AttachStaging(Payload& p, int buffer) {
  const AlignedBuffer& b = staging_.at(static_cast<size_t>(buffer));
  p.host = at::from_blob(b.data(), {p.numel}, at::TensorOptions().dtype(p.dtype).device(at::kCPU));
  p.staging = buffer;
  p.host_valid = false;
}

void PayloadStore::DetachStaging(Payload& p) {
  p.host = at::Tensor();
  p.staging = -1;
  p.host_valid = false;
}

void PayloadStore::Wait(DiskStore::Ticket ticket) const {
  absl::Status status = disk_->Wait(ticket);
  if (!status.ok()) throw StatusException(std::move(status));
}

DiskStore::Ticket PayloadStore::StartLoad(Payload& p, int buffer) {
  AttachStaging(p, buffer);
  if (!p.disk_valid) return 0;
  return disk_->Read(p.disk_file, p.host.data_ptr());
}

void PayloadStore::FinishLoad(Payload& p, DiskStore::Ticket ticket) {
  if (p.disk_valid) {
    Wait(ticket);
  } else {
    // Never written: optimizer states before their first update.
    HostAllocationScope host;
    p.host.zero_();
  }
  p.host_valid = true;
}

DiskStore::Ticket PayloadStore::StartStore(Payload& p) {
  p.disk_valid = false;
  return disk_->Write(p.disk_file, p.host.data_ptr());
}

void PayloadStore::FinishStore(Payload& p, DiskStore::Ticket ticket) {
  Wait(ticket);
  p.disk_valid = true;
  DetachStaging(p);
}

void PayloadStore::HostBuffer(Payload& p) {
  if (p.home == Tier::kDisk) {
    AttachStaging(p, 0);
  } else {
    EnsureHost(p);
  }
}

void PayloadStore::WriteHome(Payload& p) {
  if (p.home == Tier::kDisk) FinishStore(p, StartStore(p));
}

void PayloadStore::WithCurrentCopy(const Payload& p, const std::function<void(const at::Tensor&)>& fn) const {
  if (p.host_valid) return fn(p.host);
  if (p.resident && p.device_valid) return fn(p.device);
  if (p.home == Tier::kDisk && p.disk_valid) {
    const AlignedBuffer& b = staging_.front();
    Wait(disk_->Read(p.disk_file, b.data()));
    return fn(at::from_blob(b.data(), {p.numel}, at::TensorOptions().dtype(p.dtype).device(at::kCPU)));
  }
  throw std::logic_error(absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind), ": no current copy"));
}

}  // namespace ferry
