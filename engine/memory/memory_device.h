#pragma once

// Where model data and compute live during training, seen by the memory
// manager: capacity, memory in use, allocation of chunk buffers, and
// transfers between a chunk's host and device copies.
//
// Two implementations: CudaDevice (a GPU through LibTorch's device-generic
// APIs) and SimulatedDevice (CPU memory with a hard capacity, for machines
// without a GPU and for tests).

#include <ATen/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// The completion of a copy issued to a device's copy engine, as a CUDA event
// is. Empty (default-constructed): nothing to wait for.
class TransferEvent {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    // Whether the copy has finished (never blocks).
    virtual bool done() const = 0;
  };
  TransferEvent() = default;
  explicit TransferEvent(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool empty() const { return impl_ == nullptr; }
  bool done() const { return impl_ == nullptr || impl_->done(); }
  Impl* impl() const { return impl_.get(); }
  const std::shared_ptr<Impl>& shared() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// Transfer time as the device measured it (CUDA: timing events; the
// simulated device: its copy engine's clock).
struct TransferTimes {
  // Time the copy engines spent copying, overlapped with compute or not.
  double copy_seconds = 0;
  // Time compute stood waiting for copies (ComputeWaitsFor): on a GPU the
  // compute stream's stall, which the host never sees; on the simulated
  // device the compute thread's wait.
  double stall_seconds = 0;
};

class MemoryDevice {
 public:
  virtual ~MemoryDevice() = default;

  // "sim", "cuda:0".
  virtual std::string name() const = 0;
  // Where compute tensors and chunks' device copies live.
  virtual c10::Device compute_device() const = 0;
  // Bytes the job may use on the device: the device's memory or the job's
  // budget, whichever is smaller.
  virtual uint64_t capacity_bytes() const = 0;

  // Device memory in use, model data and everything else (activations,
  // workspace), now and at its peak since ResetPeak(). A block given back
  // whose copies are still under way is not in use (as in a CUDA caching
  // allocator's "allocated"), though it takes its room until they are done
  // (releasing_bytes).
  virtual uint64_t allocated_bytes() const = 0;
  virtual uint64_t peak_allocated_bytes() const = 0;
  virtual void ResetPeak() = 0;

  // Memory for a chunk's device copy. Throws c10::OutOfMemoryError when it
  // does not fit, as any other allocation on the device would.
  virtual c10::DataPtr AllocateDevice(size_t bytes) = 0;
  // What a released device copy points at: any read or write of it is a
  // fault, so a bug that touches a chunk that is not resident shows at once.
  virtual c10::DataPtr ReleasedPlaceholder(size_t bytes) = 0;
  // A 1-D buffer of `dtype` for a chunk's host copy (pinned where that lets
  // transfers overlap compute).
  virtual at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype) = 0;

  // Copies between a chunk's host and device copies (same shape, same
  // type, contiguous), issued to the device's copy engine: one queue a
  // direction, each in order, running beside compute. A copy starts once
  // the compute issued before it (which may write its source) and `after`
  // are done; the event it returns completes with it. Both tensors must
  // stay allocated until then (a device buffer given back goes through
  // ReleaseAfterTransfers).
  virtual TransferEvent CopyToDevice(const at::Tensor& host, const at::Tensor& device,
                                     const TransferEvent& after = TransferEvent()) = 0;
  virtual TransferEvent CopyToHost(const at::Tensor& device, const at::Tensor& host,
                                   const TransferEvent& after = TransferEvent()) = 0;
  // Compute issued from now on waits for `event` (and only for it): the
  // copy that filled a buffer it is about to read.
  virtual void ComputeWaitsFor(const TransferEvent& event) = 0;
  // The host waits until every copy issued so far is done (before it reads
  // or writes host copies).
  virtual void SynchronizeTransfers() = 0;
  // A device buffer of `bytes` given back (a chunk's copy released): the
  // memory is not reused, nor freed, before the copies issued so far that
  // may touch it are done.
  virtual void ReleaseAfterTransfers(c10::DataPtr data, size_t bytes) = 0;
  // Device memory given back that waits for its copies: in use until they
  // are done (SynchronizeTransfers frees it all).
  virtual uint64_t releasing_bytes() const { return 0; }
  // Gives back memory the device holds without using it (a caching
  // allocator's free segments, blocks waiting for copies), so that an
  // allocation refused although the plan made room for it can succeed:
  // the first remedy for an out-of-memory error, before evicting more.
  virtual void ReleaseCachedMemory() {}
  // Capacity taken by no allocation that ReleaseCachedMemory cannot give
  // back: a caching allocator's fragments (free parts of segments that live
  // blocks hold), which small allocations may still use but a chunk cannot.
  // The plan keeps room for them.
  virtual uint64_t unusable_bytes() const { return 0; }
  // Transfer time measured since the last call; copies still running count
  // in a later call.
  virtual TransferTimes TakeTransferTimes() = 0;
  // Compute is about to run a period's work, its waits issued: a mark in
  // the device's timeline, where it keeps one (the simulated device).
  virtual void ComputeBegins() {}
};

// The device for `name` ("cpu" gives the simulated device, "cuda" or
// "cuda:N" a GPU). `budget_bytes` caps the capacity; 0 means the device's
// memory, or for the simulated device a quarter of host memory.
absl::StatusOr<std::unique_ptr<MemoryDevice>> MakeMemoryDevice(absl::string_view name,
                                                               uint64_t budget_bytes);

}  // namespace ferry
