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
      to_device_stream_(Guard().getStreamFromGlobalPool(device_, /*isHighPriority=*/false)),
      to_host_stream_(Guard().getStreamFromGlobalPool(device_, /*isHighPriority=*/false)) {
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

namespace {

// A copy's completion: a CUDA event recorded on its stream after it.
class CudaTransferEvent final : public TransferEvent::Impl {
 public:
  explicit CudaTransferEvent(c10::Event event) : event(std::move(event)) {}
  bool done() const override { return event.query(); }
  c10::Event event;
};

}  // namespace

TransferEvent CudaDevice::Copy(const c10::Stream& stream, const at::Tensor& src, const at::Tensor& dst,
                               const TransferEvent& after) {
  // The copy must not read a buffer compute is still writing, nor one a
  // copy the other way is still filling.
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(Guard().getStream(device_));
  ready.block(stream);
  if (auto* other = static_cast<const CudaTransferEvent*>(after.impl())) other->event.block(stream);
  {
    c10::StreamGuard guard(stream);
    dst.copy_(src, /*non_blocking=*/true);
  }
  c10::Event done(c10::DeviceType::CUDA);
  done.record(stream);
  return TransferEvent(std::make_shared<CudaTransferEvent>(std::move(done)));
}

TransferEvent CudaDevice::CopyToDevice(const at::Tensor& host, const at::Tensor& device, const TransferEvent& after) {
  return Copy(to_device_stream_, host, device, after);
}

TransferEvent CudaDevice::CopyToHost(const at::Tensor& device, const at::Tensor& host, const TransferEvent& after) {
  return Copy(to_host_stream_, device, host, after);
}

void CudaDevice::ComputeWaitsFor(const TransferEvent& event) {
  if (auto* e = static_cast<const CudaTransferEvent*>(event.impl())) e->event.block(Guard().getStream(device_));
}

void CudaDevice::SynchronizeTransfers() {
  to_device_stream_.synchronize();
  to_host_stream_.synchronize();
}

void CudaDevice::ReleaseAfterTransfers(c10::DataPtr data) {
  // The caching allocator reuses the block only once both streams are past
  // the copies queued so far.
  if (data.get() == nullptr) return;
  Guard().recordDataPtrOnStream(data, to_device_stream_);
  Guard().recordDataPtrOnStream(data, to_host_stream_);
}

}  // namespace ferry
