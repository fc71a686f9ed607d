#pragma once

// The chunks of a managed model and the periods of its training step: the
// data the memory manager's parts share (see chunk_manager.h for the whole).
//
// A step is a fixed cycle of periods: the forward of each stage (in order),
// the backward of each stage (in reverse), then the optimizer. Each chunk has
// three payloads -- its parameters, gradients and optimizer states -- whose
// copies payload_store.h keeps; each managed tensor is a view of its chunk.
//
// Not thread-safe: one training loop drives it.

#include <ATen/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/memory/host_worker.h"
#include "engine/memory/payload_store.h"
#include "engine/memory/placement_plan.h"
#include "engine/memory/tensor_state.h"
#include "engine/optim/cpu_adam.h"
#include "engine/parallel/communicator.h"

namespace ferry {

// The CPU kernels' name for a payload's element type.
inline LowType LowTypeOf(c10::ScalarType t) {
  return t == at::kHalf ? LowType::kFloat16 : t == at::kBFloat16 ? LowType::kBFloat16 : LowType::kFloat32;
}

constexpr int kPayloadKinds = 3;

// A model parameter handed to the manager.
struct ManagedParam {
  std::string name;
  at::Tensor tensor;
  // Whether AdamW's weight decay applies.
  bool decay = true;
  // Whole (and so with the same gradient) on every rank of the tensor
  // group; false for a tensor-parallel shard.
  bool replicated = true;
  // Set: `tensor` holds no values yet (a placeholder of its shape), and
  // this writes its initial value into the flat fp32 view it is given as
  // the parameter's chunk is filled. Called in the order of the parameters,
  // each once (chunks follow first use, which for a model is its order).
  std::function<void(at::Tensor flat)> init;
  // With `init`: the host bytes its call takes while it runs (the manager
  // counts the largest against the host budget while it fills chunks).
  uint64_t init_scratch_bytes = 0;
};

// A stage of the forward: a name and the parameters it computes with.
struct StageParams {
  std::string name;
  std::vector<int> params;
  // Its activations may be recomputed in the backward instead of kept (a
  // transformer block: its output depends only on its input and weights).
  bool recomputable = false;
};

struct Chunk {
  int id = 0;
  int64_t capacity = 0;
  int64_t used = 0;
  // The part of the chunk this rank updates: all of it, or with sharding
  // (MemoryOptions::shard) its data rank's 1/D, elements [shard_begin,
  // shard_begin + shard_numel) -- the optimizer states hold those alone.
  int64_t shard_begin = 0;
  int64_t shard_numel = 0;
  // Of the shard, the elements in use (0 where the shard lies past `used`).
  int64_t shard_used() const { return std::clamp<int64_t>(used - shard_begin, 0, shard_numel); }
  bool sharded() const { return shard_numel != capacity; }
  // A sharded chunk made whole in `whole` (its capacity's elements), which
  // holds this rank's shard at its place: every data rank's shard gathered
  // into it. A collective of `data`, the group the chunk is sharded over
  // (std::logic_error if it is not).
  void GatherShards(Communicator* data, const at::Tensor& whole) const;
  // The same, started (Communicator::StartAllGatherInto).
  std::unique_ptr<PendingCollective> StartGatherShards(Communicator* data, const at::Tensor& whole) const;
  // The managed tensors it holds, and the ranges weight decay applies to.
  std::vector<int> tensors;
  std::vector<DecaySegment> decay;
  // The class of the plan in effect: every chunk is kStreamed until a plan
  // made after a warm-up is applied.
  ChunkClass chunk_class = ChunkClass::kStreamed;
  Payload payloads[kPayloadKinds];
  // This step: gradients started (zeroed, or left for their claims) and
  // accumulating; complete and reduced.
  bool grad_started = false;
  bool grad_reduced = false;
  // The optimizer states hold values (after the first update; from the
  // start in mixed precision, where they hold the fp32 masters).
  bool optimizer_initialized = false;
  // The optimizer's update of its host copies while it runs beside the
  // training loop (chunk_optimizer.h); null or done when none is. Until it
  // is done nothing reads or writes the chunk's host copies: a fetch or an
  // eviction waits for it (PayloadMover::AwaitUpdate), a prefetch passes the
  // chunk by.
  std::shared_ptr<const HostTask> update;

  bool device_homed() const { return chunk_class == ChunkClass::kDeviceHomed; }
  Payload& payload(PayloadKind kind) { return payloads[static_cast<int>(kind)]; }
  const Payload& payload(PayloadKind kind) const { return payloads[static_cast<int>(kind)]; }
};

struct ManagedTensor {
  std::string name;
  // The model's parameter: a view of its chunk's device copy.
  at::Tensor param;
  int chunk = 0;
  int64_t offset = 0;
  int64_t numel = 0;
  TensorState state = TensorState::kFree;
  // Backward periods that use it each step, and those left this step.
  int backward_uses = 0;
  int uses_left = 0;
  // Whole on every rank of the tensor group (false: a tensor-parallel shard).
  bool replicated = true;
  // Its gradient's writer claims it (GradientClaims): a step's gradients
  // leave it unwritten at their start, `grad_unwritten` until the claim or,
  // where none comes, until its chunk's backward is complete (then zeroed).
  bool grad_claimed = false;
  bool grad_unwritten = false;
};

struct ChunkTable {
  std::vector<Chunk> chunks;
  std::vector<ManagedTensor> tensors;
  std::vector<StageParams> stages;
  // Per stage and per period: the chunks it computes with (none for the
  // optimizer period).
  std::vector<std::vector<int>> stage_chunks;
  std::vector<std::vector<int>> period_chunks;

  int stage_count() const { return static_cast<int>(stages.size()); }
  int cycle() const { return 2 * stage_count() + 1; }
  int ForwardPeriod(int stage) const { return stage; }
  int BackwardPeriod(int stage) const { return 2 * stage_count() - 1 - stage; }
  int OptimizerPeriod() const { return 2 * stage_count(); }
  bool IsBackward(int period) const { return period >= stage_count() && period < OptimizerPeriod(); }
  // "forward h.3", "backward h.3" ("recompute+backward h.3" where the stage
  // recomputes: `recompute` per stage, may be empty), "optimizer", "set-up"
  // for a period < 0.
  std::string PeriodName(int period, const std::vector<bool>& recompute) const;

  Chunk& chunk(int c) { return chunks[static_cast<size_t>(c)]; }
  const Chunk& chunk(int c) const { return chunks[static_cast<size_t>(c)]; }
  Payload& payload(int c, PayloadKind kind) { return chunk(c).payload(kind); }
  // Bytes of model data whose device copies hold memory now.
  uint64_t DeviceModelBytes() const;
  // Whether the payload's device copy holds values still needed: parameters
  // always; gradients from their first backward use until reduced (and for
  // a chunk updated on the device, until the update); optimizer states once
  // they hold values.
  bool Preserve(const Payload& p) const;
  // Fills stage_chunks and period_chunks from the stages and tensors, and
  // each tensor's backward uses. INVALID_ARGUMENT when a stage names a
  // parameter that is not there.
  absl::Status IndexStages();
};

}  // namespace ferry
