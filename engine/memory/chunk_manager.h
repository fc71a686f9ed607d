#pragma once

// The heterogeneous memory manager: keeps a model's parameters, gradients and
// optimizer states in flat chunks, moves them between the device and the host
// as each period of the training step needs them, and runs the optimizer
// where each chunk's optimizer states live.
//
// A step is a fixed cycle of periods: the forward of each stage (in order),
// the backward of each stage (in reverse), then the optimizer. The caller
// runs each stage's forward through RunStage(); autograd hooks placed there
// mark the backward periods. The first step (and the first after the batch
// shape changes) is a warm-up: chunks are fetched only for the period that
// needs them and released right after, while the manager records how much
// non-model memory (activations, workspace) each period uses. The policy then
// plans where every chunk lives (see placement_plan.h), and later steps keep
// to that plan, evicting the payload whose next use is farthest when room is
// short and prefetching the next period's chunks when room allows.
//
// Gradient accumulation: a step may run its forward and backward periods
// several times over (micro-batches) before the one optimizer period. The
// first micro-batch's periods are the ones traced and planned; the later
// ones repeat them. A chunk's gradients are zeroed once a step and then
// accumulate: for a micro-batch before the last, a chunk whose backward is
// complete is not reduced -- a chunk updated on the device keeps its
// gradients there, any other sends them to its host side (kept, in the
// gradients' own type) and fetches them back to add to in the next
// micro-batch's backward. Only the last micro-batch reduces each chunk (one
// data-parallel all-reduce a step), norms it and sends it where it is
// updated.
//
// Parameter tensors become views of their chunk's device buffer, and their
// .grad views of the gradient chunk's. A buffer that is not resident points
// at memory that faults on access, so a period that touches a chunk it did
// not declare is caught.
//
// The manager runs the step's periods and leaves each concern to a part:
//   chunk_table.h       the chunks, their tensors and the periods (shared)
//   tier_plan.h         which payloads live on the host and which on disk
//   payload_store.h     each payload's copies per tier and the host budget
//   payload_mover.h     copies between the device and the host or disk
//   period_tracer.h     the warm-up's trace, the prediction, recompute
//   placement_policy.h  the plan, and what to fetch, evict and prefetch
//   gradient_reducer.h  gradients reduced, normed and sent where updated
//   chunk_optimizer.h   AdamW over the chunks, pipelined from disk
//   chunk_values.h      construction, checkpoints, the master weights
//
// Not thread-safe: one training loop drives it.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/gradient_claims.h"
#include "engine/memory/chunk_layout.h"
#include "engine/memory/chunk_optimizer.h"
#include "engine/memory/chunk_table.h"
#include "engine/memory/chunk_values.h"
#include "engine/memory/gradient_reducer.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/memory/payload_mover.h"
#include "engine/memory/payload_store.h"
#include "engine/memory/period_tracer.h"
#include "engine/memory/placement_policy.h"
#include "engine/memory/placement_report.h"
#include "engine/memory/tier_plan.h"
#include "engine/parallel/communicator.h"

namespace ferry {

// The collective groups a rank trains in; null is a group of one. Both
// must outlive the manager.
struct ManagerGroups {
  // Tensor parallel: the gradient norm sums the shards once and the
  // replicated tensors once.
  Communicator* tensor = nullptr;
  // Data parallel: each chunk's gradients are averaged over the group as
  // soon as the chunk's backward is complete.
  Communicator* data = nullptr;
};

class ChunkManager : public GradientClaims {
 public:
  // Takes over `params` (their data moves into chunks, whose host-side
  // copies start with the parameters' current values; each parameter's own
  // memory is freed as its chunk is filled) for a model run as `stages`.
  // The tier plan (tier_plan.h) decides which chunks keep their optimizer
  // states on disk. RESOURCE_EXHAUSTED, with the numbers per tier, when the
  // host and disk budgets cannot hold the model's data; INVALID_ARGUMENT
  // for a chunk size that cannot hold a parameter or an unusable disk_dir.
  // `on_filled`, if set, is called after each chunk is filled with (chunks
  // filled, chunks): returning false stops there (CANCELLED).
  using FillProgress = std::function<bool(int filled, int chunks)>;
  static absl::StatusOr<std::unique_ptr<ChunkManager>> Create(MemoryDevice* device,
                                                              std::vector<ManagedParam> params,
                                                              std::vector<StageParams> stages,
                                                              const MemoryOptions& options,
                                                              const OptimizerOptions& optimizer,
                                                              ManagerGroups groups = {},
                                                              const FillProgress& on_filled = nullptr);
  ~ChunkManager() override;

  // The gradients of managed parameters whose writer claimed them in an
  // earlier step start unwritten (no zeroing pass); one that is not claimed
  // is zeroed when its chunk's backward is complete. Others: false.
  bool Claim(const at::Tensor& param) override;

  // Starts a step: `micro_batches` forward/backward passes (each ended by
  // FinishBackward), then OptimizerStep. `batch_shape` is one micro-batch's;
  // a shape or a micro-batch count other than the last traced ones starts a
  // warm-up.
  void BeginStep(const std::vector<int64_t>& batch_shape, int micro_batches = 1);
  // Runs stage `stage`'s forward, `fn(input)`, with its chunks on the device,
  // and hooks its backward. If the stage recomputes this step, `fn` runs
  // without keeping its intermediates and again in the backward (with the
  // random number generators as they were, so dropout masks are the same):
  // it must stay callable until the backward is done.
  at::Tensor RunStage(int stage, const at::Tensor& input,
                      const std::function<at::Tensor(const at::Tensor&)>& fn);
  // Whether `stage` recomputes its activations this step, and all that do.
  bool Recomputes(int stage) const { return tracer_.Recomputes(stage); }
  std::vector<int> RecomputedStages() const { return tracer_.RecomputedStages(); }
  // After loss.backward(): closes the backward periods the hooks could not
  // (stages whose input needs no gradient) and ends the micro-batch; the
  // next RunStage starts the next one. At the end of a warm-up's last
  // micro-batch, plans the placement; RESOURCE_EXHAUSTED, with the numbers
  // and what to change, when no placement fits the device.
  absl::Status FinishBackward();
  // Whether the micro-batch running now is the step's last.
  bool last_micro_batch() const { return micro_batch_ + 1 >= micro_batches_; }
  // Unscales the gradients by `loss_scale`, clips them to `max_grad_norm` (0:
  // no clipping) and runs AdamW on every chunk where its optimizer states
  // live, after the step's every micro-batch; `step` is the 1-based count of applied updates (bias correction).
  // If any gradient is inf or NaN the step is skipped: no weight or state
  // changes. With OptimizerOptions::overlap, the chunks updated on the host
  // are updated beside what follows, each before the next step touches it;
  // ParameterValues, SaveState and RestoreState wait for them all.
  OptimizerResult OptimizerStep(int64_t step, double lr, double max_grad_norm, double loss_scale = 1.0);
  StepMemoryStats EndStep();

  // Evaluation, between steps: from BeginEval to EndEval, RunStage runs each
  // stage's forward without gradients (and without recomputation), fetching
  // its chunks as a training forward does -- after the last update's tasks
  // on them -- with nothing traced and nothing counted in a step's figures.
  void BeginEval() { eval_ = true; }
  void EndEval() { eval_ = false; }

  PlacementReport Placement() const;
  // A copy of every managed parameter's fp32 (master) values, in the order
  // given to Create, on the CPU. Parameter tensors themselves may point at a
  // released chunk between periods: read them through this.
  std::vector<at::Tensor> ParameterValues() const;
  // What a checkpoint keeps of the model data: every chunk's parameters and
  // optimizer states (with the fp32 masters in mixed precision), read from
  // wherever their current copy is -- the device, the host or the disk --
  // one payload at a time into `sink`, so that no more than one chunk's
  // payload is held for it. Between steps.
  using StateSink = ChunkValues::StateSink;
  absl::Status SaveState(const StateSink& sink) const;
  // The bytes SaveState writes.
  uint64_t StateBytes() const;
  // Whether a copy of the whole state (StateBytes) fits in memory.host_budget
  // beside the most the tier plan has the host hold during a step: if not, a
  // checkpoint streams SaveState to its file instead of snapshotting it.
  bool StateSnapshotFits() const;
  // Before the first step: the chunks take SaveState()'s `size` bytes, read
  // in order from `source` (which fills exactly the bytes asked), one
  // payload at a time into its home tier. INVALID_ARGUMENT if the layout
  // differs (another model, precision or shard); `source`'s own errors as
  // they are.
  using StateSource = ChunkValues::StateSource;
  absl::Status RestoreState(uint64_t size, const StateSource& source);
  // A message for an out-of-memory error raised during the step: where it
  // happened, what was on the device, and what to change.
  std::string ExplainOutOfMemory(const std::string& what) const;

  // Throws std::logic_error naming the tensor unless every chunk `stage`
  // computes with has its parameters current on the device: run after each
  // period's chunks are brought in, before its compute is issued.
  void CheckResident(int stage) const;

  const ChunkLayout& layout() const { return layout_; }
  const TierPlan& tier_plan() const { return tier_plan_; }
  // The disk tier's scratch directory; empty when nothing is on disk.
  std::string disk_dir() const { return store_.disk() != nullptr ? store_.disk()->scratch_dir() : std::string(); }
  // Host memory held for model data now, and its peak since Create.
  uint64_t host_model_bytes() const { return store_.host_model_bytes(); }
  uint64_t peak_host_model_bytes() const { return store_.peak_host_model_bytes(); }
  bool warmup() const { return tracer_.warmup(); }

  // Called by the backward hooks.
  void PreBackward(int stage);
  void PostBackward(int stage);
  // Called by a recomputing stage's backward: re-runs its forward with
  // gradients, measuring the activations it keeps.
  at::Tensor Recompute(int stage, const at::Tensor& input);

 private:
  ChunkManager(MemoryDevice* device, const MemoryOptions& options, const OptimizerOptions& optimizer,
               ManagerGroups groups, ChunkLayout layout, ChunkTable table);

  std::string PeriodName(int period) const { return table_.PeriodName(period, tracer_.recompute()); }
  void BeginPeriod(int period);
  void EndPeriod(int period);
  void SetStates(int stage, TensorState to);

  MemoryDevice* device_;
  MemoryOptions options_;
  ChunkLayout layout_;
  ChunkTable table_;
  TierPlan tier_plan_;
  // The step's figures, which the parts below add to.
  StepMemoryStats stats_;
  PayloadStore store_;
  PeriodTracer tracer_;
  PayloadMover mover_;
  PlacementPolicy policy_;
  GradientReducer reducer_;
  ChunkOptimizer optimizer_;
  ChunkValues values_;
  DiskStats disk_at_step_start_;
  // The managed tensor of each parameter, for Claim.
  absl::flat_hash_map<const c10::TensorImpl*, int> tensor_of_;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> stage_fns_;  // this step
  std::vector<bool> backward_started_;  // per stage, this micro-batch
  std::vector<bool> backward_done_;     // per stage, this micro-batch
  // This step's micro-batches, and the one running (0-based).
  int micro_batches_ = 1;
  int micro_batch_ = 0;
  bool eval_ = false;
};

}  // namespace ferry
