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
// Parameter tensors become views of their chunk's device buffer, and their
// .grad views of the gradient chunk's. A buffer that is not resident points
// at memory that faults on access, so a period that touches a chunk it did
// not declare is caught.
//
// Not thread-safe: one training loop drives it.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/memory/chunk_layout.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/memory/payload_store.h"
#include "engine/memory/placement_plan.h"
#include "engine/memory/placement_report.h"
#include "engine/memory/tensor_state.h"
#include "engine/memory/tier_plan.h"
#include "engine/optim/cpu_adam.h"
#include "engine/optim/flat_adamw.h"
#include "engine/parallel/communicator.h"

namespace ferry {

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

// A stage of the forward: a name and the parameters it computes with.
struct StageParams {
  std::string name;
  std::vector<int> params;
  // Its activations may be recomputed in the backward instead of kept (a
  // transformer block: its output depends only on its input and weights).
  bool recomputable = false;
};

// Hyper-parameters of the optimizer that do not change over training, and
// the precision of the weights the model computes with.
struct OptimizerOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // kFloat, or kHalf / kBFloat16 for mixed precision: weights and gradients
  // in that type, fp32 master weights kept with the optimizer states.
  c10::ScalarType param_dtype = c10::kFloat;
};

struct OptimizerResult {
  // The global gradient norm before clipping (unscaled).
  double grad_norm = 0;
  // The gradients overflowed: nothing was updated.
  bool skipped = false;
};

class ChunkManager {
 public:
  // Takes over `params` (their data moves into chunks, whose host-side
  // copies start with the parameters' current values; each parameter's own
  // memory is freed as its chunk is filled) for a model run as `stages`.
  // The tier plan (tier_plan.h) decides which chunks keep their optimizer
  // states on disk. RESOURCE_EXHAUSTED, with the numbers per tier, when the
  // host and disk budgets cannot hold the model's data; INVALID_ARGUMENT
  // for a chunk size that cannot hold a parameter or an unusable disk_dir.
  static absl::StatusOr<std::unique_ptr<ChunkManager>> Create(MemoryDevice* device,
                                                              std::vector<ManagedParam> params,
                                                              std::vector<StageParams> stages,
                                                              const MemoryOptions& options,
                                                              const OptimizerOptions& optimizer,
                                                              ManagerGroups groups = {});
  ~ChunkManager();

  // Starts a step. A batch shape other than the last traced one starts a
  // warm-up.
  void BeginStep(const std::vector<int64_t>& batch_shape);
  // Runs stage `stage`'s forward, `fn(input)`, with its chunks on the device,
  // and hooks its backward. If the stage recomputes this step, `fn` runs
  // without keeping its intermediates and again in the backward (with the
  // random number generators as they were, so dropout masks are the same):
  // it must stay callable until the backward is done.
  at::Tensor RunStage(int stage, const at::Tensor& input,
                      const std::function<at::Tensor(const at::Tensor&)>& fn);
  // Whether `stage` recomputes its activations this step, and all that do.
  bool Recomputes(int stage) const { return recompute_[static_cast<size_t>(stage)]; }
  std::vector<int> RecomputedStages() const;
  // After loss.backward(): closes the backward periods the hooks could not
  // (stages whose input needs no gradient). At the end of a warm-up, plans
  // the placement; RESOURCE_EXHAUSTED, with the numbers and what to change,
  // when no placement fits the device.
  absl::Status FinishBackward();
  // Unscales the gradients by `loss_scale`, clips them to `max_grad_norm` (0:
  // no clipping) and runs AdamW on every chunk where its optimizer states
  // live; `step` is the 1-based count of applied updates (bias correction).
  // If any gradient is inf or NaN the step is skipped: no weight or state
  // changes.
  OptimizerResult OptimizerStep(int64_t step, double lr, double max_grad_norm, double loss_scale = 1.0);
  StepMemoryStats EndStep();

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
  using StateSink = std::function<absl::Status(const void* data, size_t size)>;
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
  using StateSource = std::function<absl::Status(void* data, size_t size)>;
  absl::Status RestoreState(uint64_t size, const StateSource& source);
  // A message for an out-of-memory error raised during the step: where it
  // happened, what was on the device, and what to change.
  std::string ExplainOutOfMemory(const std::string& what) const;

  const ChunkLayout& layout() const { return layout_; }
  const TierPlan& tier_plan() const { return tier_plan_; }
  // The disk tier's scratch directory; empty when nothing is on disk.
  std::string disk_dir() const { return store_.disk() != nullptr ? store_.disk()->scratch_dir() : std::string(); }
  // Host memory held for model data now, and its peak since Create.
  uint64_t host_model_bytes() const { return store_.host_model_bytes(); }
  uint64_t peak_host_model_bytes() const { return store_.peak_host_model_bytes(); }
  bool warmup() const { return warmup_; }

  // Called by the backward hooks.
  void PreBackward(int stage);
  void PostBackward(int stage);
  // Called by a recomputing stage's backward: re-runs its forward with
  // gradients, measuring the activations it keeps.
  at::Tensor Recompute(int stage, const at::Tensor& input);

 private:
  struct Chunk;
  struct ManagedTensor;

  ChunkManager(MemoryDevice* device, MemoryOptions options, OptimizerOptions optimizer);

  int ForwardPeriod(int stage) const { return stage; }
  int BackwardPeriod(int stage) const { return 2 * stage_count() - 1 - stage; }
  int OptimizerPeriod() const { return 2 * stage_count(); }
  int stage_count() const { return static_cast<int>(stages_.size()); }
  int cycle() const { return 2 * stage_count() + 1; }
  std::string PeriodName(int period) const;

  // At construction: the chunk's parameters become views of its device
  // copy (their gradients of the gradient chunk's), freeing what they were
  // built in.
  void TakeOver(const Chunk& chunk, const std::vector<ManagedParam>& params);
  Payload& payload(int chunk, PayloadKind kind);
  const Payload& payload(int chunk, PayloadKind kind) const;

  void Evict(Payload& p);
  // Makes the payload current on the device.
  void Fetch(Payload& p, bool prefetch);
  void MakeRoom(uint64_t bytes, int period, const std::vector<Payload*>& keep);
  void Prepare(int period, const std::vector<Payload*>& needed);
  void Prefetch(int period);
  std::vector<Payload*> Needed(int period);
  uint64_t DeviceModelBytes() const;
  uint64_t Predicted(int period) const;

  void BeginPeriod(int period, const std::vector<Payload*>& needed);
  void EndPeriod(int period);
  void SetStates(int stage, TensorState to);
  // A chunk's gradients are complete: average them over the data group
  // (in the background, while the backward goes on), then take their norm
  // and move them where the optimizer runs.
  void Reduce(Chunk& chunk);
  void CompleteReduce(Chunk& chunk);
  void FinishPendingReduce();
  void UpdateOnCpu(Chunk& chunk, bool device_copies, const AdamWHyper& hyper);
  bool mixed() const { return optimizer_.param_dtype != c10::kFloat; }
  void ApplyPlan();
  void Demote();
  bool Preserve(const Payload& p) const;
  absl::Status PlanAfterWarmup();
  // The placement policy's plan for `in`.
  Plan PlanFor(const PlanInput& in) const;
  std::vector<bool> InitialRecompute() const;
  // What keeping `stage`'s activations adds to every period from its forward
  // to its backward, as the warm-up measured it.
  uint64_t KeepCost(int stage) const;
  // The warm-up trace as it would be with only `recompute` recomputing.
  std::vector<uint64_t> TraceWith(const std::vector<bool>& recompute) const;
  void ReleaseAfterPeriod(int period);
  PlanInput MakePlanInput() const;

  MemoryDevice* device_;
  PayloadStore store_;
  TierPlan tier_plan_;
  DiskStats disk_at_step_start_;
  SimdPath simd_;
  MemoryOptions options_;
  OptimizerOptions optimizer_;
  ManagerGroups groups_;
  // The chunk whose data-parallel all-reduce is in flight.
  Chunk* pending_chunk_ = nullptr;
  std::unique_ptr<PendingCollective> pending_reduce_;
  ChunkLayout layout_;
  std::vector<ManagedTensor> tensors_;
  std::vector<Chunk> chunks_;
  std::vector<StageParams> stages_;
  std::vector<std::vector<int>> stage_chunks_;
  std::vector<std::vector<int>> period_chunks_;

  Plan plan_;
  bool plan_applied_ = false;
  bool warmup_ = true;
  std::vector<int64_t> traced_shape_;
  std::vector<uint64_t> non_model_;   // per period, from the last warm-up
  std::vector<uint64_t> predicted_;   // per period, for steady steps
  std::vector<bool> recompute_;                       // per stage, current
  std::vector<bool> traced_recompute_;                // per stage, in the warm-up
  std::vector<std::function<at::Tensor(const at::Tensor&)>> stage_fns_;  // this step
  std::vector<uint64_t> kept_activation_bytes_;       // per stage, measured
  std::vector<uint64_t> input_bytes_;                 // per stage
  std::vector<bool> backward_started_;  // per stage, this step
  std::vector<bool> backward_done_;     // per stage, this step
  int current_period_ = -1;
  uint64_t period_model_bytes_ = 0;
  // What each period of the current (then last) step measured and moved.
  struct PeriodMeasure {
    uint64_t non_model_bytes = 0;
    uint64_t device_model_bytes = 0;
    int evictions = 0;
    int fetches = 0;
    int prefetches = 0;
  };
  std::vector<PeriodMeasure> step_periods_;
  double grad_sq_sum_ = 0;
  StepMemoryStats stats_;
};

}  // namespace ferry
