#pragma once

// The simulated device: CPU memory with a hard capacity. Every CPU tensor
// allocation counts against the capacity (model data placed on the device,
// activations, workspace) unless made inside a HostAllocationScope; going
// over it throws c10::OutOfMemoryError, as a GPU would. Device and host
// copies of a chunk are separate buffers; released device copies point at
// inaccessible memory. Transfers are real copies made by a copy engine, as
// a GPU's: a thread a direction, each running its queue in order beside
// compute, with events that compute waits for; a released buffer is freed
// only after the copies issued before its release. So prefetch overlaps
// compute here, and a missing wait is a real race.
//
// It works by installing a counting CPU allocator in LibTorch (once per
// process); at most one SimulatedDevice may exist at a time.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/memory/memory_device.h"

namespace ferry {

// While alive, CPU tensor allocations on this thread count as host memory,
// not simulated-device memory. Harmless when no simulated device exists.
class HostAllocationScope {
 public:
  HostAllocationScope();
  ~HostAllocationScope();
  HostAllocationScope(const HostAllocationScope&) = delete;
  HostAllocationScope& operator=(const HostAllocationScope&) = delete;

 private:
  bool previous_;
};

// Byte counters shared by the allocator and the allocations it hands out.
struct SimulatedMemoryCounters {
  // Device memory taken against the capacity: blocks in use and blocks
  // given back whose copies still read or write them.
  std::atomic<uint64_t> device_bytes{0};
  // Of those, the blocks in use (a CUDA caching allocator's "allocated"):
  // one given back stops counting at once, as it does there, so that what a
  // period measures does not depend on how fast the copies ran.
  std::atomic<uint64_t> device_allocated_bytes{0};
  std::atomic<uint64_t> device_peak_bytes{0};
  std::atomic<uint64_t> host_bytes{0};
  uint64_t capacity_bytes = 0;
  // Memory counted against the capacity but in no allocation (see
  // SimulatedDevice::SetReservedSlack).
  std::atomic<uint64_t> reserved_slack_bytes{0};
  std::atomic<bool> slack_releasable{true};
};

// A copy made by the simulated device's copy engine, in its timeline
// (steady_clock nanoseconds).
struct CopyRecord {
  uint64_t id = 0;
  bool to_device = false;
  uint64_t bytes = 0;
  int64_t enqueued_ns = 0, started_ns = 0, finished_ns = 0;
  // When compute first waited for it (0: never), whether compute had to
  // block there because the copy was not done, and if so when it went on.
  int64_t waited_ns = 0;
  bool blocked = false;
  int64_t resumed_ns = 0;
};

struct DeviceTimeline {
  std::vector<CopyRecord> copies;
  // Each ComputeBegins() mark.
  std::vector<int64_t> compute_begins;
};

class CopyEngine;

class SimulatedDevice : public MemoryDevice {
 public:
  explicit SimulatedDevice(uint64_t capacity_bytes);
  ~SimulatedDevice() override;

  std::string name() const override { return "sim"; }
  c10::Device compute_device() const override { return c10::Device(c10::kCPU); }
  uint64_t capacity_bytes() const override { return counters_->capacity_bytes; }
  uint64_t allocated_bytes() const override;
  uint64_t peak_allocated_bytes() const override;
  void ResetPeak() override;
  c10::DataPtr AllocateDevice(size_t bytes) override;
  c10::DataPtr ReleasedPlaceholder(size_t bytes) override;
  at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype) override;
  TransferEvent CopyToDevice(const at::Tensor& host, const at::Tensor& device,
                             const TransferEvent& after = TransferEvent()) override;
  TransferEvent CopyToHost(const at::Tensor& device, const at::Tensor& host,
                           const TransferEvent& after = TransferEvent()) override;
  void ComputeWaitsFor(const TransferEvent& event) override;
  void SynchronizeTransfers() override;
  void ReleaseAfterTransfers(c10::DataPtr data, size_t bytes) override;
  uint64_t releasing_bytes() const override;
  void ReleaseCachedMemory() override;
  uint64_t unusable_bytes() const override { return reserved_slack_bytes(); }
  TransferTimes TakeTransferTimes() override;
  void ComputeBegins() override;

  // A GPU's faults the plan cannot see: `bytes` of the capacity taken by
  // no allocation, as a caching allocator's reserved but unallocated
  // segments (cached blocks, fragments) are, so that an allocation the plan
  // made room for is refused. `releasable`: ReleaseCachedMemory gives it
  // back (cached segments); otherwise it stays (fragments pinned by live
  // blocks), and only evicting more makes room.
  void SetReservedSlack(uint64_t bytes, bool releasable);
  uint64_t reserved_slack_bytes() const;

  // CPU tensor memory counted as host memory (host copies and host-side work).
  uint64_t host_allocated_bytes() const;

  // Record the copy engine's timeline from now on (for tests), and read it.
  void KeepTimeline(bool keep);
  DeviceTimeline timeline() const;

 private:
  std::shared_ptr<SimulatedMemoryCounters> counters_;
  std::unique_ptr<CopyEngine> engine_;
};

}  // namespace ferry
