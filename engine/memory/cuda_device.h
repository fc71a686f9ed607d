#pragma once

// A CUDA GPU through LibTorch's device-generic APIs: chunk buffers from the
// caching allocator (capped at the job's budget), pinned host copies,
// transfers on a side stream that compute waits on with events.

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include "engine/memory/memory_device.h"

namespace ferry {

class CudaDevice : public MemoryDevice {
 public:
  // `budget_bytes` 0 means the whole device.
  CudaDevice(c10::DeviceIndex index, uint64_t budget_bytes);

  std::string name() const override;
  c10::Device compute_device() const override { return device_; }
  uint64_t capacity_bytes() const override { return capacity_bytes_; }
  uint64_t allocated_bytes() const override;
  uint64_t peak_allocated_bytes() const override;
  void ResetPeak() override;
  c10::DataPtr AllocateDevice(size_t bytes) override;
  c10::DataPtr ReleasedPlaceholder(size_t bytes) override;
  at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype) override;
  void CopyToDevice(const at::Tensor& host, const at::Tensor& device) override;
  void CopyToHost(const at::Tensor& device, const at::Tensor& host) override;
  void ComputeWaitsForTransfers() override;
  void SynchronizeTransfers() override;
  void RecordTransferUse(const c10::DataPtr& data) override;

 private:
  c10::Device device_;
  uint64_t capacity_bytes_;
  c10::Stream transfer_stream_;
};

}  // namespace ferry
