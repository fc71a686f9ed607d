#pragma once

// The placement policy at run time: plans where every chunk lives once a
// warm-up has traced the step (placement_plan.h does the arithmetic), and in
// every period brings the chunks the period needs to the device, making room
// by evicting the payload whose next use is farthest (eviction.h), and
// prefetching the next period's chunks, evicting for them what needs no copy
// home.
//
// static keeps fixed fractions of the chunks on the device; auto plans from
// the trace. During a warm-up every chunk streams: fetched for the period
// that needs it and released right after, so the trace measures non-model
// memory with room to spare.
//
// Not thread-safe: one training loop drives it.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/memory/chunk_table.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/memory/payload_mover.h"
#include "engine/memory/period_tracer.h"
#include "engine/memory/placement_plan.h"

namespace ferry {

class PlacementPolicy {
 public:
  // Every pointer must outlive the policy. `device_update_temps`: an update
  // on the device allocates temporaries (LibTorch ops on a GPU), which the
  // plan must leave room for.
  // `weight_shards`: with full sharding, the data group the weights'
  // host copies are sharded over (null otherwise).
  PlacementPolicy(MemoryDevice* device, ChunkTable* table, PeriodTracer* tracer, PayloadMover* mover,
                  StepMemoryStats* stats, const MemoryOptions& options, bool mixed_precision,
                  bool device_update_temps, Communicator* weight_shards = nullptr);

  // The payloads `period` computes with: its chunks' parameters, and in a
  // backward period their gradients; in the optimizer period, everything of
  // the chunks updated on the device.
  std::vector<Payload*> Needed(int period);
  // Before `period`: makes room and brings `needed` to the device (compute
  // then waits for the copies), then prefetches the next period's chunks.
  //
  // Fully sharded, a chunk's weights come to the device as this rank's
  // shard (fetched or prefetched) and are gathered whole there from the
  // data group. A gather is a collective, so when one runs must not depend
  // on this rank's placement: a period gathers the chunks it computes with
  // that the period before it did not, and those that did but are not
  // whole on the device (released alike on every rank: a new batch shape,
  // values restored), in the order the period lists them. A chunk two
  // periods in a row compute with stays whole between them (neither
  // ReleaseAfterPeriod nor an eviction for room takes it). Under auto, the
  // next period's gathers start as this one's compute does, where every
  // rank prefetched their shards (the ranks agree on that first, one small
  // all-reduce): the gathers then run beside the compute, and the next
  // period waits for them.
  void Prepare(int period, const std::vector<Payload*>& needed);
  // After `period`: in a warm-up, and under static for the chunks it does
  // not pin, the period's parameters leave the device. Fully sharded, so do
  // any weights the next period does not compute with, whatever the policy.
  void ReleaseAfterPeriod(int period);
  // The next period gathers every chunk it computes with (values restored
  // from a checkpoint: nothing on the device is current).
  void ForgetPeriod();

  // The plan made after a warm-up, applied from the next step on. Auto also
  // chooses the stages that recompute (with the tracer). RESOURCE_EXHAUSTED,
  // with the numbers and what to change, when no placement fits the device.
  absl::Status PlanAfterWarmup();
  // Starts a step: a new batch shape goes back to the warm-up's placement
  // (`new_shape`), else a plan made and not yet applied takes effect.
  // `accumulates`: the step runs more than one micro-batch (see
  // PlanInput::accumulates).
  void BeginStep(bool new_shape, bool accumulates = false);
  // Whether a plan made after a warm-up is in effect.
  bool applied() const { return applied_; }
  const Plan& plan() const { return plan_; }
  // What the planner is given: device bytes it may fill, the trace and the
  // chunks' sizes.
  PlanInput MakePlanInput() const;

 private:
  // Evicts what keeps `bytes` more and the period's predicted non-model
  // memory from fitting (under auto, after the warm-up); returns the bytes
  // evicted. `homeward`: device bytes given back since the last period
  // whose copies home may still run (PayloadMover::TakeHomewardBytes).
  uint64_t MakeRoom(uint64_t bytes, int period, const std::vector<Payload*>& keep, uint64_t homeward);
  // Evicts at least `short_by` bytes of resident payloads other than
  // `keep`, farthest next use first, those the plan pins last (as far as
  // there are any); returns the bytes evicted.
  uint64_t EvictFor(uint64_t short_by, int period, const std::vector<Payload*>& keep);
  // The same among the payloads the plan pins on the device or among the
  // others.
  // `clean_only`: only payloads that leave at once (nothing to copy home,
  // no update running), without waiting for any copy.
  uint64_t EvictFrom(uint64_t short_by, int period, const std::vector<Payload*>& keep, bool pinned,
                     bool clean_only = false);
  // Device memory for `p` (see the retries in the .cc); throws the device's
  // out-of-memory error if even evicting everything else evictable leaves
  // no room.
  void Allocate(Payload& p, int period, const std::vector<Payload*>& keep);
  // Waits until device memory given back during copies is free, counting
  // the wait as exposed transfer.
  void WaitForReleases();
  // Runs `allocate` (which may throw the device's out-of-memory error);
  // refused, again once the memory given back is free. False if refused
  // both times.
  bool TryAfterReleases(const std::function<void()>& allocate);
  void Prefetch(int period);
  // Fully sharded: the weights `period` gathers (see Prepare); those the
  // next period gathers, started beside this one's compute where every rank
  // has their shards here; waiting for what was started.
  void GatherWeights(int period);
  void StartGathers(int period);
  void FinishGathers();
  Plan PlanFor(const PlanInput& in) const;
  void Apply();
  bool adaptive() const { return !tracer_->warmup() && options_.policy == MemoryOptions::Policy::kAuto; }

  MemoryDevice* device_;
  ChunkTable* table_;
  PeriodTracer* tracer_;
  PayloadMover* mover_;
  StepMemoryStats* stats_;
  MemoryOptions options_;
  bool mixed_;
  bool device_update_temps_;
  // The device's fragments as measured before the current period
  // (MemoryDevice::unusable_bytes): room the placement keeps for them.
  uint64_t unusable_bytes_ = 0;
  // Device bytes sent home since the period before (MakeRoom).
  uint64_t homeward_bytes_ = 0;
  bool accumulates_ = false;
  Communicator* weight_shards_;
  // The period prepared last (-1: none, or forgotten).
  int last_period_ = -1;
  // Gathers started for period `gathering_for_` (StartGathers), and the
  // chunks they make whole.
  std::vector<std::unique_ptr<PendingCollective>> gathering_;
  std::vector<int> gathered_ahead_;
  int gathering_for_ = -1;
  Plan plan_;
  bool applied_ = false;
};

}  // namespace ferry
