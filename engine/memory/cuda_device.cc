#include "engine/memory/cuda_device.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <ATen/ATen.h>

#ifdef FERRY_LIBTORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/strings/str_cat.h"
#include "engine/device/device.h"

namespace ferry {
namespace {

c10::impl::VirtualGuardImpl& Guard() {
  static c10::impl::VirtualGuardImpl* guard = new c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA);
  return *guard;
}

#ifdef FERRY_LIBTORCH_CUDA
const c10::cuda::CUDACachingAllocator::Stat& AllocatedStat(c10::DeviceIndex index) {
  thread_local c10::cuda::CUDACachingAllocator::DeviceStats stats;
  stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return stats.allocated_bytes[static_cast<size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE)];
}
#endif

}  // namespace

CudaDevice::CudaDevice(c10::DeviceIndex index, uint64_t budget_bytes)
    : device_(c10::kCUDA, index),
      capacity_bytes_(DeviceMemoryTotalBytes(device_)),
      transfer_stream_(Guard().getStreamFromGlobalPool(device_, /*isHighPriority=*/false)) {
  if (budget_bytes > 0 && budget_bytes < capacity_bytes_) {
#ifdef FERRY_LIBTORCH_CUDA
    // The allocator itself refuses to go past the budget, so every
    // allocation (not only chunks) is held to it.
    c10::cuda::CUDACachingAllocator::setMemoryFraction(double(budget_bytes) / double(capacity_bytes_),
                                                       index);
#endif
    capacity_bytes_ = budget_bytes;
  }
}

std::string CudaDevice::name() const { return device_.str(); }

uint64_t CudaDevice::allocated_bytes() const {
#ifdef FERRY_LIBTORCH_CUDA
  return static_cast<uint64_t>(AllocatedStat(device_.index()).current);
#else
  return 0;
#endif
}

uint64_t CudaDevice::peak_allocated_bytes() const {
#ifdef FERRY_LIBTORCH_CUDA
  return static_cast<uint64_t>(AllocatedStat(device_.index()).peak);
#else
  return 0;
#endif
}

void CudaDevice::ResetPeak() {
#ifdef FERRY_LIBTORCH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
#endif
}

c10::DataPtr CudaDevice::AllocateDevice(size_t bytes) {
  c10::DeviceGuard guard(device_);
  return c10::GetAllocator(c10::kCUDA)->allocate(bytes);
}

c10::DataPtr CudaDevice::ReleasedPlaceholder(size_t) { return c10::DataPtr(nullptr, device_); }

at::Tensor CudaDevice::AllocateHost(int64_t numel, c10::ScalarType dtype) {
  return at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(true));
}

void CudaDevice::CopyToDevice(const at::Tensor& host, const at::Tensor& device) {
  // The transfer stream must not read a buffer compute is still writing.
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(Guard().getStream(device_));
  ready.block(transfer_stream_);
  c10::StreamGuard stream(transfer_stream_);
  device.copy_(host, /*non_blocking=*/true);
}

void CudaDevice::CopyToHost(const at::Tensor& device, const at::Tensor& host) {
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(Guard().getStream(device_));
  ready.block(transfer_stream_);
  c10::StreamGuard stream(transfer_stream_);
  host.copy_(device, /*non_blocking=*/true);
}

void CudaDevice::ComputeWaitsForTransfers() {
  c10::Event done(c10::DeviceType::CUDA);
  done.record(transfer_stream_);
  done.block(Guard().getStream(device_));
}

void CudaDevice::SynchronizeTransfers() { transfer_stream_.synchronize(); }

void CudaDevice::RecordTransferUse(const c10::DataPtr& data) {
  if (data.get() != nullptr) Guard().recordDataPtrOnStream(data, transfer_stream_);
}

}  // namespace ferry
