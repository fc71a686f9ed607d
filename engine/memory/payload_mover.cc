#include "engine/memory/payload_mover.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void PayloadMover::AwaitUpdate(Chunk& chunk) {
  const std::shared_ptr<const HostTask> update = std::move(chunk.update);
  if (update == nullptr) return;
  const bool waits = !update->done();
  const auto start = std::chrono::steady_clock::now();
  update->Wait();  // throws the error it ended with, if any
  if (waits) stats_->update_wait_seconds += SecondsSince(start);
}

void PayloadMover::Evict(Payload& p, bool keep_values) {
  if (!p.resident) return;
  AwaitUpdate(table_->chunk(p.chunk));
  const bool saved = p.host_valid || (p.home == Tier::kDisk && p.disk_valid);
  if (p.device_valid && !saved && keep_values) {
    const auto start = std::chrono::steady_clock::now();
    if (p.home == Tier::kDisk) {
      // Through the staging slots, written behind.
      const int64_t n = p.region_numel();
      store_->StreamOut(p, [&](int64_t begin, int64_t count, const std::vector<at::Tensor>& views) {
        for (size_t r = 0; r < views.size(); ++r) {
          device_->CopyToHost(p.device.narrow(0, static_cast<int64_t>(r) * n + begin, count), views[r]);
        }
        device_->SynchronizeTransfers();  // before the write reads the slot
      });
      p.disk_valid = true;
    } else {
      // Written behind: whatever reads the host copy waits for it (a copy
      // back to the device through host_filled, the host's own work by
      // SynchronizeTransfers), and the device memory is freed after it.
      // A sharded host copy takes this rank's shard -- but gradients not yet
      // reduced are every rank's share of all of them, kept whole.
      const Chunk& chunk = table_->chunk(p.chunk);
      store_->EnsureHost(p, /*whole=*/p.kind == PayloadKind::kGrad && !chunk.grad_reduced);
      const at::Tensor from = p.HostPart(p.device);
      p.host_filled = device_->CopyToHost(from, p.host, p.host_filled);
      p.host_valid = true;
      stats_->device_to_host_bytes += static_cast<uint64_t>(from.nbytes());
      homeward_bytes_ += p.bytes;
    }
    stats_->transfer_seconds += SecondsSince(start);
    if (p.home == Tier::kDisk) stats_->device_to_host_bytes += p.bytes;
  }
  store_->Release(p);
}

void PayloadMover::StartGradients(const Chunk& chunk, Payload& p) {
  std::vector<ManagedTensor*> claimed;
  for (int i : chunk.tensors) {
    ManagedTensor& t = table_->tensors[static_cast<size_t>(i)];
    if (t.grad_claimed) claimed.push_back(&t);
  }
  std::sort(claimed.begin(), claimed.end(),
            [](const ManagedTensor* a, const ManagedTensor* b) { return a->offset < b->offset; });
  int64_t from = 0;
  for (ManagedTensor* t : claimed) {
    if (t->offset > from) p.device.narrow(0, from, t->offset - from).zero_();
    from = t->offset + t->numel;
    t->grad_unwritten = true;
  }
  if (p.device.numel() > from) p.device.narrow(0, from, p.device.numel() - from).zero_();
}

void PayloadMover::Fetch(Payload& p, bool prefetch) {
  Chunk& chunk = table_->chunk(p.chunk);
  AwaitUpdate(chunk);
  if (p.resident && p.device_valid) {
    if (!prefetch && p.prefetched) {
      ++stats_->prefetch_hits;
      p.prefetched = false;
    }
    return;
  }
  store_->Materialize(p);
  p.device_whole = true;
  if (p.kind == PayloadKind::kGrad && !chunk.grad_started) {
    StartGradients(chunk, p);
    chunk.grad_started = true;
    p.host_valid = false;
    p.disk_valid = false;
  } else if (p.kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) {
    p.device.zero_();
  } else if (p.host_valid || (p.home == Tier::kDisk && p.disk_valid)) {
    const auto start = std::chrono::steady_clock::now();
    if (p.host_valid) {
      // Read ahead: compute waits for it only where it needs the payload. A
      // sharded host copy fills this rank's shard; the policy gathers the
      // rest (PlacementPolicy::Prepare).
      const at::Tensor to = p.HostPart(p.device);
      p.device_filled = device_->CopyToDevice(p.host, to, p.host_filled);
      p.device_whole = to.numel() == p.numel;
      stats_->host_to_device_bytes += static_cast<uint64_t>(to.nbytes());
    } else {
      const int64_t n = p.region_numel();
      store_->StreamIn(p, [&](int64_t begin, int64_t count, const std::vector<at::Tensor>& views) {
        for (size_t r = 0; r < views.size(); ++r) {
          device_->CopyToDevice(views[r], p.device.narrow(0, static_cast<int64_t>(r) * n + begin, count));
        }
        device_->SynchronizeTransfers();  // the slot is read into again soon
      });
      p.device_filled = TransferEvent();  // done
      stats_->host_to_device_bytes += p.bytes;
    }
    stats_->transfer_seconds += SecondsSince(start);
    // Gradients go on accumulating on the device: the host side's copy is
    // no longer current.
    if (p.kind == PayloadKind::kGrad) {
      p.host_valid = false;
      p.disk_valid = false;
    }
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
