#include "engine/memory/simulated_device.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

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
  // Given back, waiting for its copies (no longer in device_allocated_bytes).
  bool released = false;
};
static_assert(sizeof(Allocation) <= kAlignment, "the header must fit in front of the data");

Allocation* HeaderOf(void* data) {
  return reinterpret_cast<Allocation*>(static_cast<char*>(data) - kAlignment);
}

void FreeAllocation(void* data) {
  Allocation* a = HeaderOf(data);
  if (a->counters) {
    (a->device ? a->counters->device_bytes : a->counters->host_bytes).fetch_sub(a->bytes);
    if (a->device && !a->released) a->counters->device_allocated_bytes.fetch_sub(a->bytes);
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
      const uint64_t slack = counters->reserved_slack_bytes.load();
      if (now + slack > counters->capacity_bytes) {
        counters->device_bytes.fetch_sub(bytes);
        C10_THROW_ERROR(OutOfMemoryError,
                        absl::StrCat("simulated device out of memory: tried to allocate ", Mib(bytes), " with ",
                                     Mib(now - bytes), slack > 0 ? absl::StrCat(" (and ", Mib(slack), " reserved unused)") : "",
                                     " of ", Mib(counters->capacity_bytes), " in use"));
      }
      const uint64_t in_use = counters->device_allocated_bytes.fetch_add(bytes) + bytes;
      uint64_t peak = counters->device_peak_bytes.load();
      while (in_use > peak && !counters->device_peak_bytes.compare_exchange_weak(peak, in_use)) {
      }
    } else if (counters != nullptr) {
      counters->host_bytes.fetch_add(bytes);
    }
    const size_t backing = BackingBytes(bytes);
    void* base = device && bytes >= kCacheMinBytes ? Cache().Take(backing) : nullptr;
    if (base == nullptr && posix_memalign(&base, kAlignment, backing) != 0) {
      if (device) {
        counters->device_bytes.fetch_sub(bytes);
        counters->device_allocated_bytes.fetch_sub(bytes);
      } else if (counters) {
        counters->host_bytes.fetch_sub(bytes);
      }
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

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// A copy's completion: set by the engine's thread when the copy is done.
class SimEvent final : public TransferEvent::Impl {
 public:
  explicit SimEvent(uint64_t id) : id(id) {}
  bool done() const override { return finished.load(std::memory_order_acquire); }
  const uint64_t id;
  std::atomic<bool> finished{false};
};

// The simulated device's copy engine: a thread a direction, each running
// its queue of copies in order.
class CopyEngine {
 public:
  CopyEngine() {
    for (int d = 0; d < 2; ++d) queues_[d].thread = std::thread([this, d] { Run(d); });
  }

  ~CopyEngine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    for (Queue& q : queues_) q.thread.join();
    // Nothing is queued any more: whatever waited on a copy can go.
    frees_.clear();
  }

  TransferEvent Enqueue(bool to_device, const at::Tensor& src, const at::Tensor& dst, const TransferEvent& after) {
    Job job;
    job.src = src;
    job.dst = dst;
    job.bytes = static_cast<size_t>(src.numel()) * src.element_size();
    job.source = src.data_ptr();
    job.target = dst.data_ptr();
    job.after = std::static_pointer_cast<SimEvent>(after.shared());
    std::shared_ptr<SimEvent> event;
    {
      std::lock_guard<std::mutex> lock(mu_);
      event = std::make_shared<SimEvent>(next_id_++);
      job.done = event;
      if (keep_timeline_) {
        CopyRecord r;
        r.id = event->id;
        r.to_device = to_device;
        r.bytes = job.bytes;
        r.enqueued_ns = NowNs();
        records_.push_back(r);
      }
      Queue& q = queues_[to_device ? 0 : 1];
      q.jobs.push_back(std::move(job));
      ++q.issued;
    }
    work_.notify_all();
    return TransferEvent(event);
  }

  // Compute waits for `e`: recorded in the timeline.
  void ComputeWaits(const TransferEvent& e) {
    auto* event = static_cast<SimEvent*>(e.impl());
    if (event == nullptr) return;
    std::unique_lock<std::mutex> lock(mu_);
    const bool blocked = !event->done();
    const int64_t start = NowNs();
    CopyRecord* r = keep_timeline_ ? Record(event->id) : nullptr;
    const bool first = r != nullptr && r->waited_ns == 0;
    if (first) {
      r->waited_ns = start;
      r->blocked = blocked;
    }
    if (!blocked) return;
    finished_cv_.wait(lock, [&] { return event->done(); });
    const int64_t end = NowNs();
    stall_ns_ += end - start;
    if (first) r->resumed_ns = end;  // records only grow at the back: `r` stands
  }

  // Time copying and compute's waits since the last call.
  TransferTimes TakeTimes() {
    std::lock_guard<std::mutex> lock(mu_);
    TransferTimes t;
    t.copy_seconds = double(copy_ns_) / 1e9;
    t.stall_seconds = double(stall_ns_) / 1e9;
    copy_ns_ = stall_ns_ = 0;
    return t;
  }

  // Every copy queued so far is done (each queue runs in order: counted
  // per queue, so that copies queued since, by other threads, and done
  // sooner in the other queue cannot stand in for them).
  void WaitAll() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t targets[2] = {queues_[0].issued, queues_[1].issued};
    finished_cv_.wait(lock, [&] { return queues_[0].completed >= targets[0] && queues_[1].completed >= targets[1]; });
  }

  // `data` (`bytes` of it) goes once the copies queued or running that
  // read or write it are done, at once if there are none.
  void FreeAfter(c10::DataPtr data, size_t bytes) {
    const char* begin = static_cast<const char*>(data.get());
    const char* end = begin + bytes;
    auto touches = [&](const Job& job) {
      const char* s = static_cast<const char*>(job.source);
      const char* t = static_cast<const char*>(job.target);
      return (s < end && s + job.bytes > begin) || (t < end && t + job.bytes > begin);
    };
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<SimEvent>> copies;
    for (Queue& q : queues_) {
      if (q.running != nullptr && touches(*q.running)) copies.push_back(q.running->done);
      for (const Job& job : q.jobs) {
        if (touches(job)) copies.push_back(job.done);
      }
    }
    if (copies.empty()) return;  // `data` goes on return
    if (bytes > 0) {
      // No longer in use, though it takes its room until the copies are done.
      Allocation* a = HeaderOf(data.get());
      if (a->counters && a->device && !a->released) {
        a->released = true;
        a->counters->device_allocated_bytes.fetch_sub(a->bytes);
      }
    }
    releasing_bytes_ += bytes;
    frees_.push_back({std::move(copies), std::move(data), bytes});
  }

  uint64_t releasing_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return releasing_bytes_;
  }

  void MarkCompute() {
    std::lock_guard<std::mutex> lock(mu_);
    if (keep_timeline_) compute_begins_.push_back(NowNs());
  }

  void KeepTimeline(bool keep) {
    std::lock_guard<std::mutex> lock(mu_);
    keep_timeline_ = keep;
  }

  DeviceTimeline timeline() const {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceTimeline t;
    t.copies.assign(records_.begin(), records_.end());
    t.compute_begins = compute_begins_;
    return t;
  }

 private:
  struct Job {
    at::Tensor src, dst;  // kept allocated until the copy is done
    const void* source = nullptr;
    void* target = nullptr;
    size_t bytes = 0;
    std::shared_ptr<SimEvent> after, done;
  };
  struct Queue {
    std::thread thread;
    std::deque<Job> jobs;
    const Job* running = nullptr;  // the copy under way
    // Copies queued and finished (their memory freed) so far.
    uint64_t issued = 0, completed = 0;
  };
  struct PendingFree {
    std::vector<std::shared_ptr<SimEvent>> after;
    c10::DataPtr data;
    size_t bytes;
  };

  CopyRecord* Record(uint64_t id) {
    if (records_.empty() || id < records_.front().id) return nullptr;
    const uint64_t index = id - records_.front().id;
    return index < records_.size() && records_[index].id == id ? &records_[index] : nullptr;
  }

  void Run(int direction) {
    Queue& q = queues_[direction];
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return stopping_ || !q.jobs.empty(); });
        if (q.jobs.empty()) return;  // stopping, and drained
        job = std::move(q.jobs.front());
        q.jobs.pop_front();
        q.running = &job;
        if (job.after != nullptr) finished_cv_.wait(lock, [&] { return job.after->done(); });
      }
      // The copy's span, as the timeline records it and the copy time sums.
      const int64_t started = NowNs();
      if (job.bytes > 0) std::memcpy(job.target, job.source, job.bytes);
      const int64_t finished = NowNs();
      const int64_t copied = finished - started;
      std::vector<c10::DataPtr> to_free;
      uint64_t freeing = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        q.running = nullptr;
        copy_ns_ += copied;
        job.done->finished.store(true, std::memory_order_release);
        if (keep_timeline_) {
          if (CopyRecord* r = Record(job.done->id)) {
            r->started_ns = started;
            r->finished_ns = finished;
          }
        }
        for (auto it = frees_.begin(); it != frees_.end();) {
          const bool ready = std::all_of(it->after.begin(), it->after.end(),
                                         [](const std::shared_ptr<SimEvent>& e) { return e->done(); });
          if (ready) {
            to_free.push_back(std::move(it->data));
            freeing += it->bytes;
            it = frees_.erase(it);
          } else {
            ++it;
          }
        }
      }
      finished_cv_.notify_all();  // compute waiting for this copy goes on
      // The memory it held goes before SynchronizeTransfers returns, and
      // stops counting as releasing only once it is gone: a caller that
      // reads no releasing bytes finds the memory free.
      job = Job();
      to_free.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        releasing_bytes_ -= freeing;
        ++q.completed;
      }
      finished_cv_.notify_all();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable finished_cv_;
  Queue queues_[2];  // 0: to the device, 1: to the host
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  std::list<PendingFree> frees_;
  uint64_t releasing_bytes_ = 0;
  int64_t copy_ns_ = 0;
  int64_t stall_ns_ = 0;
  bool keep_timeline_ = false;
  std::deque<CopyRecord> records_;
  std::vector<int64_t> compute_begins_;
};

HostAllocationScope::HostAllocationScope() : previous_(t_host_scope) { t_host_scope = true; }
HostAllocationScope::~HostAllocationScope() { t_host_scope = previous_; }

SimulatedDevice::SimulatedDevice(uint64_t capacity_bytes)
    : counters_(std::make_shared<SimulatedMemoryCounters>()), engine_(std::make_unique<CopyEngine>()) {
  counters_->capacity_bytes = capacity_bytes;
  Allocator().Attach(counters_);
}

SimulatedDevice::~SimulatedDevice() {
  engine_.reset();  // every copy done, every deferred free made
  Allocator().Attach(nullptr);
}

uint64_t SimulatedDevice::allocated_bytes() const { return counters_->device_allocated_bytes.load(); }
uint64_t SimulatedDevice::peak_allocated_bytes() const { return counters_->device_peak_bytes.load(); }
uint64_t SimulatedDevice::host_allocated_bytes() const { return counters_->host_bytes.load(); }

void SimulatedDevice::ResetPeak() { counters_->device_peak_bytes.store(counters_->device_allocated_bytes.load()); }

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

namespace {

void CheckCopy(const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK(src.scalar_type() == dst.scalar_type() && src.numel() == dst.numel() && src.is_contiguous() &&
                  dst.is_contiguous(),
              "a chunk copy needs two contiguous buffers of one type and size, got ", src.scalar_type(), " ",
              src.sizes(), " and ", dst.scalar_type(), " ", dst.sizes());
}

}  // namespace

TransferEvent SimulatedDevice::CopyToDevice(const at::Tensor& host, const at::Tensor& device,
                                            const TransferEvent& after) {
  CheckCopy(host, device);
  return engine_->Enqueue(/*to_device=*/true, host, device, after);
}

TransferEvent SimulatedDevice::CopyToHost(const at::Tensor& device, const at::Tensor& host,
                                          const TransferEvent& after) {
  CheckCopy(device, host);
  return engine_->Enqueue(/*to_device=*/false, device, host, after);
}

void SimulatedDevice::ComputeWaitsFor(const TransferEvent& event) { engine_->ComputeWaits(event); }

void SimulatedDevice::SynchronizeTransfers() { engine_->WaitAll(); }

void SimulatedDevice::ReleaseAfterTransfers(c10::DataPtr data, size_t bytes) {
  if (data.get() == nullptr) return;
  // A device block; anything else (a placeholder) is touched by no copy.
  if (data.get_deleter() != &FreeAllocation) bytes = 0;
  engine_->FreeAfter(std::move(data), bytes);
}

uint64_t SimulatedDevice::releasing_bytes() const { return engine_->releasing_bytes(); }

void SimulatedDevice::ReleaseCachedMemory() {
  SynchronizeTransfers();
  if (counters_->slack_releasable) counters_->reserved_slack_bytes.store(0);
}

TransferTimes SimulatedDevice::TakeTransferTimes() { return engine_->TakeTimes(); }

void SimulatedDevice::SetReservedSlack(uint64_t bytes, bool releasable) {
  counters_->slack_releasable = releasable;
  counters_->reserved_slack_bytes.store(bytes);
}

uint64_t SimulatedDevice::reserved_slack_bytes() const { return counters_->reserved_slack_bytes.load(); }

void SimulatedDevice::ComputeBegins() { engine_->MarkCompute(); }

void SimulatedDevice::KeepTimeline(bool keep) { engine_->KeepTimeline(keep); }

DeviceTimeline SimulatedDevice::timeline() const { return engine_->timeline(); }

}  // namespace ferry
