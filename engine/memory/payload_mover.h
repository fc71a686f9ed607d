#pragma once

// Moves chunk payloads between the device and their host-side homes (host
// memory, or the disk tier through a staging buffer), counting what moved
// and how long the copies took. The policy decides what moves and when; the
// store (payload_store.h) keeps the copies; this makes a payload current
// where it is wanted.
//
// Not thread-safe: one training loop drives it.

#include <cstdint>
#include <utility>

#include "engine/memory/chunk_table.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/payload_store.h"
#include "engine/memory/period_tracer.h"
#include "engine/memory/placement_report.h"

namespace ferry {

class PayloadMover {
 public:
  // Every pointer must outlive the mover; `stats` is the step's figures,
  // which the mover adds to.
  PayloadMover(MemoryDevice* device, PayloadStore* store, ChunkTable* table, PeriodTracer* tracer,
               StepMemoryStats* stats)
      : device_(device), store_(store), table_(table), tracer_(tracer), stats_(stats) {}

  // Makes the payload current on the device: nothing if it is; zeros for
  // this step's first gradients and for optimizer states that hold no values
  // yet; else a copy of its host-side values. `prefetch`: ahead of the
  // period that needs it (a later on-demand Fetch counts as a hit).
  void Fetch(Payload& p, bool prefetch);
  // Gives the payload's device memory back, first copying its values home
  // if `keep_values` and the host side does not hold them already.
  void Evict(Payload& p, bool keep_values);
  // Waits for the optimizer's update of `chunk` running beside the step, if
  // any (rethrowing its error), counting the wait as exposed optimizer
  // time. Fetch and Evict wait so before they touch a chunk's copies.
  void AwaitUpdate(Chunk& chunk);
  // Device memory for the payload's copy (stale until filled): nothing if it
  // has some. Throws c10::OutOfMemoryError as the device does.
  void Materialize(Payload& p) { store_->Materialize(p); }
  // Device bytes given back since the last call whose copies home were
  // written behind (Evict): memory in use until those copies are done.
  // Counted from what was evicted, not from how far the copies have got.
  uint64_t TakeHomewardBytes() { return std::exchange(homeward_bytes_, 0); }

 private:
  // This step's gradients start in `p`, just made resident: zero, but for
  // the tensors whose writers claim them, left unwritten (grad_unwritten).
  void StartGradients(const Chunk& chunk, Payload& p);

  MemoryDevice* device_;
  PayloadStore* store_;
  ChunkTable* table_;
  PeriodTracer* tracer_;
  StepMemoryStats* stats_;
  uint64_t homeward_bytes_ = 0;
};

}  // namespace ferry
