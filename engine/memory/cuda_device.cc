#include "engine/memory/cuda_device.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <ATen/ATen.h>

#ifdef FERRY_LIBTORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/device/device.h"

namespace ferry {
namespace {

c10::impl::VirtualGuardImpl& Guard() {
  static c10::impl::VirtualGuardImpl* guard = new c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA);
  return *guard;
}

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20)); }

#ifdef FERRY_LIBTORCH_CUDA
// The caching allocator's aggregate figures (index 0 of each stat array is
// the aggregate in every LibTorch version; the enum naming it moved).
struct AllocatorBytes {
  int64_t allocated = 0, allocated_peak = 0, reserved = 0, inactive_split = 0;
};

AllocatorBytes AllocatorStats(c10::DeviceIndex index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  AllocatorBytes b;
  b.allocated = stats.allocated_bytes[0].current;
  b.allocated_peak = stats.allocated_bytes[0].peak;
  b.reserved = stats.reserved_bytes[0].current;
  b.inactive_split = stats.inactive_split_bytes[0].current;
  return b;
}

cudaStream_t Raw(const c10::Stream& stream) { return c10::cuda::CUDAStream(stream).stream(); }

void Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  (void)cudaGetLastError();  // not sticky: clear it
  TORCH_CHECK(false, what, ": ", cudaGetErrorString(error));
}
#endif

}  // namespace

#ifdef FERRY_LIBTORCH_CUDA
struct CudaDevice::TimedSpan {
  TimedSpan() {
    Check(cudaEventCreate(&begin), "cudaEventCreate");
    Check(cudaEventCreate(&end), "cudaEventCreate");
  }
  ~TimedSpan() {
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
  }
  // Seconds from begin to end once both happened, else a negative number.
  double Seconds() const {
    if (cudaEventQuery(end) != cudaSuccess) {
      (void)cudaGetLastError();  // cudaErrorNotReady
      return -1;
    }
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    return double(ms) / 1e3;
  }
  cudaEvent_t begin = nullptr, end = nullptr;
};
#else
struct CudaDevice::TimedSpan {
  double Seconds() const { return 0; }
};
#endif

CudaDevice::CudaDevice(c10::DeviceIndex index, uint64_t budget_bytes)
    : device_(c10::kCUDA, index),
      to_device_stream_(Guard().getStreamFromGlobalPool(device_, /*isHighPriority=*/false)),
      to_host_stream_(Guard().getStreamFromGlobalPool(device_, /*isHighPriority=*/false)) {
  // LibTorch makes its caching allocator when CUDA is first used: a first
  // tensor on the device does that, before the allocator is capped (capping
  // it earlier fails with "Allocator not initialized").
  (void)at::empty({1}, at::TensorOptions().device(device_).dtype(at::kByte));
  // The memory free now, as the driver reports it, and what this process's
  // allocator already holds: the CUDA context, NCCL's buffers and other
  // processes' memory are not the job's to plan with.
  const uint64_t total = DeviceMemoryTotalBytes(device_);
  capacity_bytes_ = std::min(DeviceMemoryFreeBytes(device_) + reserved_bytes(), total);
  if (budget_bytes > 0 && budget_bytes < capacity_bytes_) capacity_bytes_ = budget_bytes;
#ifdef FERRY_LIBTORCH_CUDA
  // The allocator itself refuses to reserve past the capacity, so every
  // allocation (not only chunks) is held to it.
  if (total > 0) {
    c10::cuda::CUDACachingAllocator::setMemoryFraction(double(capacity_bytes_) / double(total), index);
  }
#endif
}

CudaDevice::~CudaDevice() {
  // The timing events go with the spans; copies must be done first.
  SynchronizeTransfers();
}

std::string CudaDevice::name() const { return device_.str(); }

uint64_t CudaDevice::allocated_bytes() const {
#ifdef FERRY_LIBTORCH_CUDA
  return static_cast<uint64_t>(AllocatorStats(device_.index()).allocated);
#else
  return 0;
#endif
}

uint64_t CudaDevice::peak_allocated_bytes() const {
#ifdef FERRY_LIBTORCH_CUDA
  return static_cast<uint64_t>(AllocatorStats(device_.index()).allocated_peak);
#else
  return 0;
#endif
}

uint64_t CudaDevice::reserved_bytes() const {
#ifdef FERRY_LIBTORCH_CUDA
  return static_cast<uint64_t>(AllocatorStats(device_.index()).reserved);
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

// Nothing behind it. Compute never reaches it: the chunk manager checks on
// the host, before a period's kernels are issued, that every chunk the
// period uses is resident (ChunkManager::CheckResident), and fails naming
// the tensor; a GPU fault here would come later and poison the context.
c10::DataPtr CudaDevice::ReleasedPlaceholder(size_t) { return c10::DataPtr(nullptr, device_); }

at::Tensor CudaDevice::AllocateHost(int64_t numel, c10::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
#ifdef FERRY_LIBTORCH_CUDA
  // Exactly the bytes asked for, page-locked, and given back when the copy
  // goes: LibTorch's caching host allocator would round a chunk up to a
  // power of two (a 369 MB chunk taking 512 MiB), outside the host budget's
  // count, and keep it for the life of the process.
  void* ptr = nullptr;
  const cudaError_t error = cudaHostAlloc(&ptr, std::max<size_t>(bytes, 1), cudaHostAllocDefault);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    C10_THROW_ERROR(OutOfMemoryError, absl::StrCat("page-locked host memory: cudaHostAlloc of ", Mib(bytes),
                                                   " failed: ", cudaGetErrorString(error),
                                                   "; lower memory.host_budget or free host memory"));
  }
  return at::from_blob(
      ptr, {numel}, [](void* p) { cudaFreeHost(p); }, at::TensorOptions().dtype(dtype).device(at::kCPU));
#else
  (void)bytes;
  return at::empty({numel}, at::TensorOptions().dtype(dtype));
#endif
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
  auto span = std::make_unique<TimedSpan>();
#ifdef FERRY_LIBTORCH_CUDA
  // Timed from when the stream reaches the copy (its waits satisfied).
  Check(cudaEventRecord(span->begin, Raw(stream)), "cudaEventRecord");
#endif
  {
    c10::StreamGuard guard(stream);
    dst.copy_(src, /*non_blocking=*/true);
  }
#ifdef FERRY_LIBTORCH_CUDA
  Check(cudaEventRecord(span->end, Raw(stream)), "cudaEventRecord");
#endif
  c10::Event done(c10::DeviceType::CUDA);
  done.record(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    copies_.push_back(std::move(span));
  }
  return TransferEvent(std::make_shared<CudaTransferEvent>(std::move(done)));
}

TransferEvent CudaDevice::CopyToDevice(const at::Tensor& host, const at::Tensor& device, const TransferEvent& after) {
  return Copy(to_device_stream_, host, device, after);
}

TransferEvent CudaDevice::CopyToHost(const at::Tensor& device, const at::Tensor& host, const TransferEvent& after) {
  return Copy(to_host_stream_, device, host, after);
}

void CudaDevice::ComputeWaitsFor(const TransferEvent& event) {
  auto* e = static_cast<const CudaTransferEvent*>(event.impl());
  if (e == nullptr || e->event.query()) return;  // done: no wait to issue
  const c10::Stream compute = Guard().getStream(device_);
#ifdef FERRY_LIBTORCH_CUDA
  // The stall: from when the compute stream reaches the wait to when it
  // goes on past it.
  auto span = std::make_unique<TimedSpan>();
  Check(cudaEventRecord(span->begin, Raw(compute)), "cudaEventRecord");
  e->event.block(compute);
  Check(cudaEventRecord(span->end, Raw(compute)), "cudaEventRecord");
  std::lock_guard<std::mutex> lock(mu_);
  stalls_.push_back(std::move(span));
#else
  e->event.block(compute);
#endif
}

void CudaDevice::SynchronizeTransfers() {
  to_device_stream_.synchronize();
  to_host_stream_.synchronize();
}

void CudaDevice::ReleaseAfterTransfers(c10::DataPtr data, size_t bytes) {
  // The caching allocator reuses the block only once both streams are past
  // the copies queued so far; until then it is in use (releasing_bytes).
  if (data.get() == nullptr) return;
  Guard().recordDataPtrOnStream(data, to_device_stream_);
  Guard().recordDataPtrOnStream(data, to_host_stream_);
  Releasing r{bytes, c10::Event(c10::DeviceType::CUDA), c10::Event(c10::DeviceType::CUDA)};
  r.to_device_done.record(to_device_stream_);
  r.to_host_done.record(to_host_stream_);
  std::lock_guard<std::mutex> lock(mu_);
  releasing_.push_back(std::move(r));
}

uint64_t CudaDevice::releasing_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t bytes = 0;
  for (auto it = releasing_.begin(); it != releasing_.end();) {
    if (it->to_device_done.query() && it->to_host_done.query()) {
      it = releasing_.erase(it);
    } else {
      bytes += it->bytes;
      ++it;
    }
  }
  return bytes;
}

void CudaDevice::ReleaseCachedMemory() {
  // Blocks waiting for copies become free once the copies are done; then
  // the allocator's unused segments go back to the driver, so that the
  // next allocation finds contiguous memory if any exists.
  SynchronizeTransfers();
  {
    std::lock_guard<std::mutex> lock(mu_);
    releasing_.clear();
  }
#ifdef FERRY_LIBTORCH_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

uint64_t CudaDevice::unusable_bytes() const {
#ifdef FERRY_LIBTORCH_CUDA
  // Free blocks inside split segments: emptyCache cannot give them back.
  return static_cast<uint64_t>(AllocatorStats(device_.index()).inactive_split);
#else
  return 0;
#endif
}

TransferTimes CudaDevice::TakeTransferTimes() {
  TransferTimes t;
  std::lock_guard<std::mutex> lock(mu_);
  auto take = [](std::deque<std::unique_ptr<TimedSpan>>& spans, double& seconds) {
    for (auto it = spans.begin(); it != spans.end();) {
      const double s = (*it)->Seconds();
      if (s < 0) {
        ++it;  // still running: a later call counts it
      } else {
        seconds += s;
        it = spans.erase(it);
      }
    }
  };
  take(copies_, t.copy_seconds);
  take(stalls_, t.stall_seconds);
  return t;
}

}  // namespace ferry
