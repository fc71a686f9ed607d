#include "engine/memory/payload_mover.h"

#include <chrono>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void PayloadMover::Evict(Payload& p, bool keep_values) {
  if (!p.resident) return;
  const bool saved = p.host_valid || (p.home == Tier::kDisk && p.disk_valid);
  if (p.device_valid && !saved && keep_values) {
    store_->HostBuffer(p);
    const auto start = std::chrono::steady_clock::now();
    device_->CopyToHost(p.device, p.host);
    if (p.home == Tier::kDisk) device_->SynchronizeTransfers();  // before the write reads it
    stats_->transfer_seconds += SecondsSince(start);
    stats_->device_to_host_bytes += p.bytes;
    p.host_valid = true;
    store_->WriteHome(p);
  }
  store_->Release(p);
}

void PayloadMover::Fetch(Payload& p, bool prefetch) {
  Chunk& chunk = table_->chunk(p.chunk);
  if (p.resident && p.device_valid) {
    if (!prefetch && p.prefetched) {
      ++stats_->prefetch_hits;
      p.prefetched = false;
    }
    return;
  }
  store_->Materialize(p);
  if (p.kind == PayloadKind::kGrad && !chunk.grad_started) {
    p.device.zero_();  // this step's gradients start here
    chunk.grad_started = true;
    p.host_valid = false;
  } else if (p.kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) {
    p.device.zero_();
  } else if (p.host_valid || (p.home == Tier::kDisk && p.disk_valid)) {
    const bool staged = !p.host_valid;
    if (staged) store_->LoadHome(p);
    const auto start = std::chrono::steady_clock::now();
    device_->CopyToDevice(p.host, p.device);
    if (staged) {
      // The staging buffer is reused at once: the copy must be done.
      device_->SynchronizeTransfers();
      store_->DetachStaging(p);
    }
    stats_->transfer_seconds += SecondsSince(start);
    stats_->host_to_device_bytes += p.bytes;
    // Gradients go on accumulating on the device: the host side's copy is
    // no longer current.
    if (p.kind == PayloadKind::kGrad) p.host_valid = false;
    tracer_->CountFetch(prefetch);
    // Fetched on demand: a prefetch would have saved the wait.
    if (!prefetch && !tracer_->warmup()) ++stats_->prefetch_misses;
  } else {
    throw std::logic_error(
        absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind), ": no current copy to fetch"));
  }
  p.device_valid = true;
  p.prefetched = prefetch;
}

}  // namespace ferry
