#pragma once

// The simulated device: CPU memory with a hard capacity. Every CPU tensor
// allocation counts against the capacity (model data placed on the device,
// activations, workspace) unless made inside a HostAllocationScope; going
// over it throws c10::OutOfMemoryError, as a GPU would. Device and host
// copies of a chunk are separate buffers and transfers are real copies;
// released device copies point at inaccessible memory.
//
// It works by installing a counting CPU allocator in LibTorch (once per
// process); at most one SimulatedDevice may exist at a time.

#include <atomic>
#include <cstdint>
#include <memory>

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
  std::atomic<uint64_t> device_bytes{0};
  std::atomic<uint64_t> device_peak_bytes{0};
  std::atomic<uint64_t> host_bytes{0};
  uint64_t capacity_bytes = 0;
};

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
  void CopyToDevice(const at::Tensor& host, const at::Tensor& device) override;
  void CopyToHost(const at::Tensor& device, const at::Tensor& host) override;
  void ComputeWaitsForTransfers() override {}
  void SynchronizeTransfers() override {}
  void RecordTransferUse(const c10::DataPtr&) override {}

  // CPU tensor memory counted as host memory (host copies and host-side work).
  uint64_t host_allocated_bytes() const;

 private:
  std::shared_ptr<SimulatedMemoryCounters> counters_;
};

}  // namespace ferry
