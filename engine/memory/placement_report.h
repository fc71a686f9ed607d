#pragma once

// What the memory manager tells the world about a step and about where model
// data lives. No LibTorch: the trainer's observers and the worker use these.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/memory/placement_plan.h"

namespace ferry {

enum class PayloadKind { kParam = 0, kGrad = 1, kOptimizer = 2 };
const char* PayloadKindName(PayloadKind kind);

// What one step did.
struct StepMemoryStats {
  bool warmup = false;
  uint64_t host_to_device_bytes = 0;
  uint64_t device_to_host_bytes = 0;
  int evictions = 0;
  int prefetch_hits = 0;
  int prefetch_misses = 0;
  // Largest non-model memory of any period of the step.
  uint64_t peak_non_model_bytes = 0;
  uint64_t peak_device_bytes = 0;
  // Largest relative error of the non-model prediction over the step's
  // periods (steady steps only).
  double prediction_error = 0;
  // Model data by tier and kind at the end of the step.
  uint64_t device_bytes[3] = {0, 0, 0};
  uint64_t host_bytes[3] = {0, 0, 0};
  uint64_t disk_bytes[3] = {0, 0, 0};
  int device_chunks = 0;
  int host_chunks = 0;
  // Chunks whose gradients or optimizer states live on disk.
  int disk_chunks = 0;
  // Host memory the manager holds for model data at the end of the step
  // (host copies and staging buffers), and the most it held during it.
  uint64_t host_model_bytes = 0;
  uint64_t peak_host_model_bytes = 0;
  // Bytes moved between host memory and the disk tier.
  uint64_t host_to_disk_bytes = 0;
  uint64_t disk_to_host_bytes = 0;
  // Seconds the disk tier's threads spent reading and writing (overlapping
  // the step), and the part of the step spent waiting for them (exposed).
  double disk_read_seconds = 0;
  double disk_write_seconds = 0;
  double disk_wait_seconds = 0;
  // Stages that recomputed their activations in this step.
  std::vector<int> recomputed_stages;
  // Seconds of the step spent on copies between host and device: the host
  // waiting for them (or issuing the disk tier's) and compute stalled on
  // them, as the device timed it (exposed transfer).
  double transfer_seconds = 0;
  // Seconds the device's copy engines spent copying, overlapped or not.
  double copy_seconds = 0;
  // Device allocations refused although the plan had made room (a GPU's
  // cached or fragmented memory), each retried after giving back cached
  // memory or evicting more.
  int allocation_retries = 0;
  // Seconds the step waited for the host-side updates of the step before,
  // which run beside its forward (ChunkOptimizer): exposed optimizer time.
  double update_wait_seconds = 0;
  // Chunks whose update the step left running beside the next one.
  int overlapped_updates = 0;
  // Fully sharded: chunks whose weights' gather started a period ahead,
  // beside the compute before the period that uses them.
  int gathers_ahead = 0;
};

struct PayloadReport {
  // "p3", "g3", "o3".
  std::string id;
  PayloadKind kind = PayloadKind::kParam;
  int chunk = 0;
  // Where its values are: "device", "host", "disk", "both" (current on
  // the device and the host side), or "none" (nothing to keep, e.g.
  // gradients between steps).
  std::string tier;
  // Its size: of this rank's part, where the host side keeps a shard of it
  // (full sharding; whole on the device while a period computes with it).
  uint64_t bytes = 0;
  // Memory it holds now on each tier (a device buffer may hold stale values;
  // a host buffer of a host-homed payload, once allocated, is kept).
  uint64_t device_bytes = 0;
  uint64_t host_bytes = 0;
  uint64_t disk_bytes = 0;
  // Where its authoritative host-side copy lives: "host" or "disk".
  std::string home = "host";
  // The chunk's tensors' state: "compute" if any computes, else the state
  // they share, else "mixed".
  std::string state;
  ChunkClass chunk_class = ChunkClass::kStreamed;
  int tensors = 0;
};

struct PeriodReport {
  std::string name;
  // As planned: what the policy makes room for.
  uint64_t non_model_bytes = 0;
  std::vector<int> chunks;
  // Measured in the last warm-up.
  uint64_t warmup_non_model_bytes = 0;
  // Measured in the last step: non-model memory at its peak, model data on
  // the device during the period, and the chunk moves in it (evictions to
  // make room, on-demand fetches, prefetches for the next period).
  uint64_t step_non_model_bytes = 0;
  uint64_t step_device_model_bytes = 0;
  int evictions = 0;
  int fetches = 0;
  int prefetches = 0;
};

struct PlacementReport {
  std::string device;
  std::string policy;
  bool warmup = true;
  uint64_t capacity_bytes = 0;
  // What the policy plans to fill: capacity less the margin.
  uint64_t limit_bytes = 0;
  uint64_t host_budget_bytes = 0;
  // The disk tier: its scratch directory ("" when off) and budget.
  std::string disk_dir;
  uint64_t disk_budget_bytes = 0;
  // The tier plan's predictions: peak host bytes for model data, bytes on
  // disk, and disk traffic per step.
  uint64_t planned_host_bytes = 0;
  uint64_t planned_disk_bytes = 0;
  uint64_t planned_disk_read_bytes = 0;
  uint64_t planned_disk_write_bytes = 0;
  int64_t chunk_elements = 0;
  double chunk_waste_fraction = 0;
  std::vector<PayloadReport> payloads;
  std::vector<PeriodReport> trace;
  // Planned bytes moved per steady step.
  uint64_t planned_traffic_bytes = 0;
  // Stages whose activations are recomputed in the backward, and the
  // model's blocks they are (filled by the engine, which knows the stages).
  std::vector<int> recomputed_stages;
  std::vector<int> recomputed_blocks;
};

// The planner's input for a run as its report describes it: the warm-up
// trace and the chunks' sizes, with `limit_bytes` to fill.
PlanInput PlanInputFromReport(const PlacementReport& report, uint64_t limit_bytes);

}  // namespace ferry
