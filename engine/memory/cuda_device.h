#pragma once

// A CUDA GPU through LibTorch's device-generic APIs: chunk buffers from the
// caching allocator (capped at the job's budget), pinned host copies,
// transfers on a stream a direction; compute waits with events for the
// copies it needs, and only for those.

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
  TransferEvent CopyToDevice(const at::Tensor& host, const at::Tensor& device,
                             const TransferEvent& after = TransferEvent()) override;
  TransferEvent CopyToHost(const at::Tensor& device, const at::Tensor& host,
                           const TransferEvent& after = TransferEvent()) override;
  void ComputeWaitsFor(const TransferEvent& event) override;
  void SynchronizeTransfers() override;
  void ReleaseAfterTransfers(c10::DataPtr data) override;

 private:
  TransferEvent Copy(const c10::Stream& stream, const at::Tensor& src, const at::Tensor& dst,
                     const TransferEvent& after);

  c10::Device device_;
  uint64_t capacity_bytes_;
  c10::Stream to_device_stream_;
  c10::Stream to_host_stream_;
};

}  // namespace ferry
