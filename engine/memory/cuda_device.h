#pragma once

// A CUDA GPU through LibTorch's device-generic APIs: chunk buffers from the
// caching allocator (capped at the job's budget, within the memory the
// driver reports free at start), exactly sized page-locked host copies,
// transfers on a stream a direction; compute waits with events for the
// copies it needs, and only for those. Copies and compute's waits are timed
// with CUDA events, so transfer time is what the GPU spent, not what
// issuing it took the host.
//
// The CUDA-specific calls live in cuda_device.cc behind FERRY_LIBTORCH_CUDA;
// in a CPU-only LibTorch build this class compiles but is never made (no
// device resolves to cuda).

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <deque>
#include <memory>
#include <mutex>

#include "engine/memory/memory_device.h"

namespace ferry {

class CudaDevice : public MemoryDevice {
 public:
  // `budget_bytes` 0 means all the device memory free at start.
  CudaDevice(c10::DeviceIndex index, uint64_t budget_bytes);
  ~CudaDevice() override;

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
  void ReleaseAfterTransfers(c10::DataPtr data, size_t bytes) override;
  uint64_t releasing_bytes() const override;
  void ReleaseCachedMemory() override;
  uint64_t unusable_bytes() const override;
  TransferTimes TakeTransferTimes() override;

  // Device memory the caching allocator holds (allocated or cached), which
  // is what the budget caps.
  uint64_t reserved_bytes() const;

 private:
  TransferEvent Copy(const c10::Stream& stream, const at::Tensor& src, const at::Tensor& dst,
                     const TransferEvent& after);

  // A span of GPU time between two timing events (opaque here: CUDA
  // events in cuda_device.cc).
  struct TimedSpan;
  // Memory given back while copies may still touch it, until they are done.
  struct Releasing {
    uint64_t bytes;
    c10::Event to_device_done;
    c10::Event to_host_done;
  };

  c10::Device device_;
  uint64_t capacity_bytes_ = 0;
  c10::Stream to_device_stream_;
  c10::Stream to_host_stream_;
  mutable std::mutex mu_;
  std::deque<std::unique_ptr<TimedSpan>> copies_;  // each copy's span
  std::deque<std::unique_ptr<TimedSpan>> stalls_;  // compute's waits
  mutable std::deque<Releasing> releasing_;
};

}  // namespace ferry
