#pragma once

// How the memory manager places a job's model data. No LibTorch: the job-spec
// code fills it.

#include <cstdint>

namespace ferry {

struct MemoryOptions {
  enum class Policy { kAuto, kStatic };
  Policy policy = Policy::kAuto;
  // Host bytes for model data (host copies of chunks); 0: no limit.
  uint64_t host_budget_bytes = 0;
  // The most elements a chunk may hold; 0 searches for a size.
  int64_t chunk_elements = 0;
  // The search tries multiples of this; 0 lets the trainer use the model's
  // hidden size.
  int64_t chunk_step_elements = 0;
  // The search picks the smallest chunk size that needs at most this many
  // chunks.
  int max_chunks = 64;
  // static: fractions of chunks whose parameters / optimizer states live on
  // the host. (0, 1) is ZeRO-Offload's split.
  double static_param_host_fraction = 0.0;
  double static_optimizer_host_fraction = 1.0;
  // auto: fraction of the device kept free beyond the predicted need.
  double margin = 0.05;
  // auto: fetch the next period's chunks ahead of time when room allows.
  bool prefetch = true;
  // Activation recomputation of the stages that allow it (the transformer
  // blocks): none; all; every k-th (block index % k == 0); or auto, the
  // fewest that let the step fit the device with the margin, chosen from the
  // warm-up (which recomputes every block, to measure what each one saves).
  enum class Recompute { kNone, kAll, kEvery, kAuto };
  Recompute recompute = Recompute::kAuto;
  int recompute_every = 2;
};

inline const char* PolicyName(MemoryOptions::Policy policy) {
  return policy == MemoryOptions::Policy::kAuto ? "auto" : "static";
}

}  // namespace ferry
