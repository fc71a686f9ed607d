#include "engine/memory/simulated_device.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace {

thread_local bool t_host_scope = false;

constexpr size_t kAlignment = 64;

// Large blocks, once freed, are kept for reuse, as a GPU's caching allocator
// keeps them: a fresh block from the system costs a page fault for every
// page on first touch, which would make the simulated device slower the more
// often a step allocates (recomputation allocates a block's activations
// twice) and so distort timings. Blocks are matched by their size rounded up
// to kCacheGranularity; at most kMaxCachedBytes are kept, and all are given
// back when the device goes. Only device blocks are kept: host memory freed
// (the model's values once they are in chunks, a host copy given back) goes
// back to the system, so that the host budget bounds what the process holds.
// The counters count what was asked for, as before: caching changes no
// figure, only speed.
constexpr size_t kCacheMinBytes = size_t{1} << 20;
constexpr size_t kCacheGranularity = size_t{64} << 10;
constexpr size_t kMaxCachedBytes = size_t{2} << 30;

class BlockCache {
 public:
  // A block of `backing` bytes, or null if none is kept.
  void* Take(size_t backing) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(backing);
    if (it == blocks_.end()) return nullptr;
    void* base = it->second;
    blocks_.erase(it);
    cached_bytes_ -= backing;
    return base;
  }
  // Keeps `base`; false if the cache is full (the caller frees it).
  bool Give(void* base, size_t backing) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_bytes_ + backing > kMaxCachedBytes) return false;
    blocks_.emplace(backing, base);
    cached_bytes_ += backing;
    return true;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [backing, base] : blocks_) std::free(base);
    blocks_.clear();
    cached_bytes_ = 0;
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> blocks_;
  size_t cached_bytes_ = 0;
};

BlockCache& Cache() {
  static BlockCache* cache = new BlockCache;
  return *cache;
}

// The bytes behind an allocation of `bytes`: its header and the data,
// rounded up where the block may be cached.
size_t BackingBytes(size_t bytes) {
  const size_t data = bytes < kCacheMinBytes ? std::max<size_t>(bytes, 1)
                                             : (bytes + kCacheGranularity - 1) / kCacheGranularity * kCacheGranularity;
  return kAlignment + data;
}

// Kept in the kAlignment bytes in front of each allocation, so that the
// data pointer is also the deleter's context, as LibTorch's raw_allocate
// requires (some CPU kernels, e.g. bf16 matrix products, allocate that way).
struct Allocation {
  size_t bytes;
  size_t backing;
  bool device;
  std::shared_ptr<SimulatedMemoryCounters> counters;  // null: not counted
};
static_assert(sizeof(Allocation) <= kAlignment, "the header must fit in front of the data");

Allocation* HeaderOf(void* data) {
  return reinterpret_cast<Allocation*>(static_cast<char*>(data) - kAlignment);
}

void FreeAllocation(void* data) {
  Allocation* a = HeaderOf(data);
  if (a->counters) {
    (a->device ? a->counters->device_bytes : a->counters->host_bytes).fetch_sub(a->bytes);
  }
  const size_t backing = a->backing;
  const bool cacheable = a->device && a->bytes >= kCacheMinBytes;
  a->~Allocation();
  if (!cacheable || !Cache().Give(a, backing)) std::free(a);
}

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024.0)); }

// LibTorch's CPU allocator while a simulated device exists: counts each
// allocation against the device or the host and enforces the capacity.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const override {
    std::shared_ptr<SimulatedMemoryCounters> counters;
    {
      std::lock_guard<std::mutex> lock(mu_);
      counters = counters_;
    }
    const bool device = counters != nullptr && !t_host_scope;
    if (device) {
      const uint64_t now = counters->device_bytes.fetch_add(bytes) + bytes;
      if (now > counters->capacity_bytes) {
        counters->device_bytes.fetch_sub(bytes);
        C10_THROW_ERROR(OutOfMemoryError,
                        absl::StrCat("simulated device out of memory: tried to allocate ",
                                     Mib(bytes), " with ", Mib(now - bytes), " of ",
                                     Mib(counters->capacity_bytes), " in use"));
      }
      uint64_t peak = counters->device_peak_bytes.load();
      while (now > peak && !counters->device_peak_bytes.compare_exchange_weak(peak, now)) {
      }
    } else if (counters != nullptr) {
      counters->host_bytes.fetch_add(bytes);
    }
    const size_t backing = BackingBytes(bytes);
    void* base = device && bytes >= kCacheMinBytes ? Cache().Take(backing) : nullptr;
    if (base == nullptr && posix_memalign(&base, kAlignment, backing) != 0) {
      if (device) counters->device_bytes.fetch_sub(bytes);
      else if (counters) counters->host_bytes.fetch_sub(bytes);
      C10_THROW_ERROR(OutOfMemoryError, absl::StrCat("host out of memory allocating ", Mib(bytes)));
    }
    new (base) Allocation{bytes, backing, device, std::move(counters)};
    void* data = static_cast<char*>(base) + kAlignment;
    return c10::DataPtr(data, data, &FreeAllocation, c10::Device(c10::kCPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &FreeAllocation; }

  void Attach(std::shared_ptr<SimulatedMemoryCounters> counters) {
    std::lock_guard<std::mutex> lock(mu_);
    if (counters != nullptr && counters_ != nullptr) {
      throw std::logic_error("only one SimulatedDevice may exist at a time");
    }
    counters_ = std::move(counters);
    if (counters_ == nullptr) Cache().Clear();
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<SimulatedMemoryCounters> counters_;
};

// Installed on first use and kept for the life of the process: LibTorch's
// allocator registry is process-wide and tensors may outlive any device.
CountingCpuAllocator& Allocator() {
  static CountingCpuAllocator* allocator = [] {
    auto* a = new CountingCpuAllocator;
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return *allocator;
}

struct Placeholder {
  void* ptr;
  size_t bytes;
};

void UnmapPlaceholder(void* context) {
  auto* p = static_cast<Placeholder*>(context);
  munmap(p->ptr, p->bytes);
  delete p;
}

}  // namespace

HostAllocationScope::HostAllocationScope() : previous_(t_host_scope) { t_host_scope = true; }
HostAllocationScope::~HostAllocationScope() { t_host_scope = previous_; }

SimulatedDevice::SimulatedDevice(uint64_t capacity_bytes)
    : counters_(std::make_shared<SimulatedMemoryCounters>()) {
  counters_->capacity_bytes = capacity_bytes;
  Allocator().Attach(counters_);
}

SimulatedDevice::~SimulatedDevice() { Allocator().Attach(nullptr); }

uint64_t SimulatedDevice::allocated_bytes() const { return counters_->device_bytes.load(); }
uint64_t SimulatedDevice::peak_allocated_bytes() const { return counters_->device_peak_bytes.load(); }
uint64_t SimulatedDevice::host_allocated_bytes() const { return counters_->host_bytes.load(); }

void SimulatedDevice::ResetPeak() { counters_->device_peak_bytes.store(counters_->device_bytes.load()); }

c10::DataPtr SimulatedDevice::AllocateDevice(size_t bytes) {
  const bool previous = t_host_scope;
  t_host_scope = false;
  c10::DataPtr data = Allocator().allocate(bytes);
  t_host_scope = previous;
  return data;
}

c10::DataPtr SimulatedDevice::ReleasedPlaceholder(size_t bytes) {
  if (bytes == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
  // Address space only: no memory behind it, and any access faults.
  void* ptr = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (ptr == MAP_FAILED) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
  return c10::DataPtr(ptr, new Placeholder{ptr, bytes}, &UnmapPlaceholder, c10::Device(c10::kCPU));
}

at::Tensor SimulatedDevice::AllocateHost(int64_t numel, c10::ScalarType dtype) {
  HostAllocationScope host;
  return at::empty({numel}, at::TensorOptions().dtype(dtype));
}

void SimulatedDevice::CopyToDevice(const at::Tensor& host, const at::Tensor& device) {
  device.copy_(host);
}

void SimulatedDevice::CopyToHost(const at::Tensor& device, const at::Tensor& host) {
  host.copy_(device);
}

}  // namespace ferry
