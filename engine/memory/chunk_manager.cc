#include "engine/memory/chunk_manager.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"

namespace ferry {
namespace {

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20)); }

// Identity in forward. Placed on a stage's output (`post` false) its backward
// runs as the stage's backward starts, when the gradient of its output
// arrives; placed on the stage's input (`post` true) its backward runs once
// the stage's backward is complete, every parameter gradient included (those
// are accumulated as soon as they are computed).
struct StageHook : public torch::autograd::Function<StageHook> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t manager, int64_t stage, bool post) {
    ctx->saved_data["manager"] = manager;
    ctx->saved_data["stage"] = stage;
    ctx->saved_data["post"] = post;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* manager = reinterpret_cast<ChunkManager*>(ctx->saved_data["manager"].toInt());
    const int stage = static_cast<int>(ctx->saved_data["stage"].toInt());
    if (ctx->saved_data["post"].toBool()) {
      manager->PostBackward(stage);
    } else {
      manager->PreBackward(stage);
    }
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Activation checkpointing of one stage: the forward runs without keeping
// its intermediates (autograd is off inside a custom function's forward) and
// saves only the input and the generators' state; the backward restores that
// state, re-runs the forward with gradients through the manager, and
// back-propagates through it, accumulating the weights' gradients as the
// first run would have.
struct CheckpointStage : public torch::autograd::Function<CheckpointStage> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t manager, int64_t stage, c10::Device device,
                            const std::function<at::Tensor(const at::Tensor&)>* fn) {
    ctx->saved_data["manager"] = manager;
    ctx->saved_data["stage"] = stage;
    const GeneratorStates rng = SaveGenerators(device);
    ctx->saved_data["rng_cpu"] = rng.cpu;
    ctx->saved_data["rng_device"] = rng.device.defined() ? rng.device : at::Tensor();
    ctx->saved_data["device"] = device.str();
    ctx->save_for_backward({x});
    return (*fn)(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* manager = reinterpret_cast<ChunkManager*>(ctx->saved_data["manager"].toInt());
    const int stage = static_cast<int>(ctx->saved_data["stage"].toInt());
    const c10::Device device(ctx->saved_data["device"].toStringRef());
    const at::Tensor x = ctx->get_saved_variables()[0];
    // Replay the generators as the first run saw them, then put back where
    // they are now, so the rest of training draws the same numbers either way.
    const GeneratorStates now = SaveGenerators(device);
    RestoreGenerators(device, {ctx->saved_data["rng_cpu"].toTensor(), ctx->saved_data["rng_device"].toTensor()});
    at::Tensor input = x.detach().requires_grad_(x.requires_grad());
    at::Tensor output;
    {
      at::AutoGradMode grad(true);
      output = manager->Recompute(stage, input);
    }
    RestoreGenerators(device, now);
    torch::autograd::backward({output}, {grads[0]});
    return {input.requires_grad() ? input.grad() : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

ChunkManager::ChunkManager(MemoryDevice* device, const MemoryOptions& options, const OptimizerOptions& optimizer,
                           ManagerGroups groups, ChunkLayout layout, ChunkTable table)
    : device_(device),
      options_(options),
      layout_(std::move(layout)),
      table_(std::move(table)),
      store_(device, options.host_budget_bytes),
      tracer_(&table_, options),
      mover_(device, &store_, &table_, &tracer_, &stats_),
      policy_(device, &table_, &tracer_, &mover_, &stats_, options, optimizer.param_dtype != c10::kFloat,
              UpdatesWithTorchOps(*device, optimizer),
              options.shard == MemoryOptions::Shard::kFull && groups.data != nullptr && groups.data->size() > 1
                  ? groups.data
                  : nullptr),
      reducer_(&table_, &mover_, groups.tensor, groups.data),
      optimizer_(device, &store_, &table_, &mover_, optimizer, groups.data),
      values_(device, &store_, &table_, optimizer.param_dtype, groups.data),
      stage_fns_(table_.stages.size()),
      backward_started_(table_.stages.size(), false),
      backward_done_(table_.stages.size(), false) {
  for (Chunk& chunk : table_.chunks) {
    for (Payload& p : chunk.payloads) store_.InitDevice(p);
  }
  for (size_t i = 0; i < table_.tensors.size(); ++i) {
    tensor_of_[table_.tensors[i].param.unsafeGetTensorImpl()] = static_cast<int>(i);
  }
}

bool ChunkManager::Claim(const at::Tensor& param) {
  const auto it = tensor_of_.find(param.unsafeGetTensorImpl());
  if (it == tensor_of_.end()) return false;
  ManagedTensor& t = table_.tensors[static_cast<size_t>(it->second)];
  t.grad_claimed = true;  // from the next start of its gradients on
  if (!t.grad_unwritten) return false;
  t.grad_unwritten = false;
  return true;
}

ChunkManager::~ChunkManager() = default;

absl::StatusOr<std::unique_ptr<ChunkManager>> ChunkManager::Create(
    MemoryDevice* device, std::vector<ManagedParam> params, std::vector<StageParams> stages,
    const MemoryOptions& options, const OptimizerOptions& optimizer, ManagerGroups groups,
    const FillProgress& on_filled) {
  if (params.empty() || stages.empty()) return absl::InvalidArgumentError("no parameters to manage");
  const bool mixed = optimizer.param_dtype != c10::kFloat;
  std::vector<int64_t> numels;
  for (const ManagedParam& p : params) numels.push_back(p.tensor.numel());
  // A tensor's group is the first stage using it: chunks follow stages.
  std::vector<int> first_stage(params.size(), static_cast<int>(stages.size()));
  for (size_t s = stages.size(); s-- > 0;) {
    for (int i : stages[s].params) {
      if (i >= 0 && i < static_cast<int>(params.size())) first_stage[static_cast<size_t>(i)] = static_cast<int>(s);
    }
  }
  ChunkSearchOptions search;
  search.step_elements = options.chunk_step_elements > 0 ? options.chunk_step_elements : 1024;
  search.max_chunks = options.max_chunks;
  absl::StatusOr<ChunkLayout> layout = ChooseChunkLayout(numels, first_stage, options.chunk_elements, search);
  if (!layout.ok()) return layout.status();
  // Sharded, every chunk splits into D equal parts, one a data rank.
  const bool sharded = options.shard != MemoryOptions::Shard::kNone && groups.data != nullptr &&
                       groups.data->size() > 1;
  const int64_t shards = sharded ? groups.data->size() : 1;
  const int64_t shard_rank = sharded ? groups.data->rank() : 0;
  const std::vector<int64_t> shard_elements = ShardChunks(&layout->capacity, shards);
  // Fully sharded, the weights' and gradients' host side holds the shard too.
  const bool full = sharded && options.shard == MemoryOptions::Shard::kFull;

  ChunkTable table;
  table.stages = std::move(stages);
  table.chunks.resize(static_cast<size_t>(layout->chunk_count()));
  for (int c = 0; c < layout->chunk_count(); ++c) {
    Chunk& chunk = table.chunk(c);
    chunk.id = c;
    chunk.capacity = layout->capacity[static_cast<size_t>(c)];
    chunk.used = layout->used[static_cast<size_t>(c)];
    chunk.shard_numel = chunk.capacity / shards;
    chunk.shard_begin = shard_rank * chunk.shard_numel;
    for (int k = 0; k < kPayloadKinds; ++k) {
      Payload& p = chunk.payloads[k];
      p.kind = static_cast<PayloadKind>(k);
      p.chunk = c;
      // Optimizer states: both moments, and in mixed precision the fp32
      // master weights after them, of this rank's shard.
      p.regions = p.kind == PayloadKind::kOptimizer ? (mixed ? 3 : 2) : 1;
      p.numel = p.regions * (p.kind == PayloadKind::kOptimizer ? chunk.shard_numel : chunk.capacity);
      p.dtype = p.kind == PayloadKind::kOptimizer ? c10::kFloat : optimizer.param_dtype;
      p.bytes = static_cast<uint64_t>(p.numel) * c10::elementSize(p.dtype);
      if (full && p.kind != PayloadKind::kOptimizer) {
        p.host_begin = chunk.shard_begin;
        p.host_count = chunk.shard_numel;
      }
    }
  }
  table.tensors.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorSlot& slot = layout->slots[i];
    ManagedTensor& t = table.tensors[i];
    t.name = params[i].name;
    t.param = params[i].tensor;
    t.chunk = slot.chunk;
    t.offset = slot.offset;
    t.numel = slot.numel;
    t.replicated = params[i].replicated;
    Chunk& chunk = table.chunk(slot.chunk);
    chunk.tensors.push_back(static_cast<int>(i));
    if (params[i].decay) chunk.decay.push_back({slot.offset, slot.numel});
  }
  RETURN_IF_ERROR(table.IndexStages());

  // Where each chunk's host side lives; the model's values as built count
  // against the host budget until they move into chunks, and the largest
  // scratch an initialisation takes until every chunk is filled.
  TierInput tiers = ChunkTierInput(layout->capacity, mixed);
  tiers.optimizer_elements = shard_elements;
  if (full) tiers.host_elements = shard_elements;
  for (const ManagedParam& p : params) {
    if (p.init) {
      tiers.init_scratch_bytes = std::max(tiers.init_scratch_bytes, p.init_scratch_bytes);
    } else {
      tiers.built_bytes += static_cast<uint64_t>(p.tensor.numel()) * p.tensor.element_size();
    }
  }
  tiers.host_limit_bytes = options.host_budget_bytes;
  tiers.disk_limit_bytes = options.disk_dir.empty() ? 0 : options.disk_budget_bytes;
  tiers.disk_dir = options.disk_dir;
  tiers.micro_batches = options.micro_batches;
  TierPlan tier_plan = PlanTiers(tiers);
  if (!tier_plan.feasible) return absl::ResourceExhaustedError(tier_plan.problem);

  std::unique_ptr<ChunkManager> m(
      new ChunkManager(device, options, optimizer, groups, *std::move(layout), std::move(table)));
  m->tier_plan_ = std::move(tier_plan);
  std::vector<Payload*> on_disk;
  for (Chunk& chunk : m->table_.chunks) {
    const size_t c = static_cast<size_t>(chunk.id);
    for (const auto& [kind, tier] : {std::pair(PayloadKind::kGrad, m->tier_plan_.grad_tier[c]),
                                     std::pair(PayloadKind::kOptimizer, m->tier_plan_.optimizer_tier[c])}) {
      if (tier != Tier::kDisk) continue;
      Payload& p = chunk.payload(kind);
      p.slice_elements = m->tier_plan_.slice_elements[c];
      on_disk.push_back(&p);
    }
  }
  RETURN_IF_ERROR(m->store_.OpenDisk(options, on_disk, m->tier_plan_.slot_bytes));
  m->store_.AddHostBytes(static_cast<int64_t>(tiers.built_bytes + tiers.init_scratch_bytes));
  RETURN_IF_ERROR(CallTorch("placing parameters in chunks", [&]() -> absl::Status {
    return m->values_.Fill(params, options.values_from_checkpoint, tiers.init_scratch_bytes, on_filled);
  }));
  return m;
}

// --- Periods. ---

void ChunkManager::BeginPeriod(int period) {
  tracer_.EnterPeriod(period);
  policy_.Prepare(period, policy_.Needed(period));
  device_->ResetPeak();
  tracer_.StartMeasuring(table_.DeviceModelBytes());
}

void ChunkManager::EndPeriod(int period) { tracer_.EndPeriod(period, device_->peak_allocated_bytes(), &stats_); }

void ChunkManager::SetStates(int stage, TensorState to) {
  for (int i : table_.stages[static_cast<size_t>(stage)].params) {
    ManagedTensor& t = table_.tensors[static_cast<size_t>(i)];
    t.state = Transition(t.name, t.state, to);
  }
}

void ChunkManager::CheckResident(int stage) const {
  // Compute is about to use the stage's chunks' device copies. A released
  // copy has no memory behind it; on a GPU a kernel reading it would fault
  // only later, poisoning the context, so the host says which tensor now,
  // before any kernel is issued.
  for (int i : table_.stages[static_cast<size_t>(stage)].params) {
    const ManagedTensor& t = table_.tensors[static_cast<size_t>(i)];
    const Payload& p = table_.chunk(t.chunk).payload(PayloadKind::kParam);
    if (p.resident && p.device_valid) continue;
    throw std::logic_error(absl::StrCat("tensor ", t.name, " is about to be computed with, but chunk ", t.chunk,
                                        "'s parameters are ", p.resident ? "stale" : "not",
                                        " on the device (", device_->name(), ")"));
  }
}

at::Tensor ChunkManager::RunStage(int stage, const at::Tensor& input,
                                  const std::function<at::Tensor(const at::Tensor&)>& fn) {
  const int period = table_.ForwardPeriod(stage);
  SetStates(stage, TensorState::kCompute);
  if (eval_) {
    // Outside the step's cycle: no period is measured (the last step's
    // figures stay as they were).
    tracer_.EnterPeriod(-1);
    policy_.Prepare(period, policy_.Needed(period));
    CheckResident(stage);
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = fn(input);
    }
    SetStates(stage, TensorState::kHold);
    policy_.ReleaseAfterPeriod(period);
    return y;
  }
  BeginPeriod(period);
  CheckResident(stage);
  const int64_t self = reinterpret_cast<int64_t>(this);
  at::Tensor x = input.requires_grad() ? StageHook::apply(input, self, stage, /*post=*/true) : input;
  at::Tensor y;
  if (tracer_.Recomputes(stage)) {
    stage_fns_[static_cast<size_t>(stage)] = fn;
    tracer_.RecordInput(stage, static_cast<uint64_t>(x.numel()) * x.element_size());
    y = CheckpointStage::apply(x, self, stage, device_->compute_device(), &stage_fns_[static_cast<size_t>(stage)]);
  } else {
    y = fn(x);
  }
  if (y.requires_grad()) y = StageHook::apply(y, self, stage, /*post=*/false);
  EndPeriod(period);
  SetStates(stage, TensorState::kHold);
  policy_.ReleaseAfterPeriod(period);
  return y;
}

void ChunkManager::PreBackward(int stage) {
  backward_started_[static_cast<size_t>(stage)] = true;
  SetStates(stage, TensorState::kCompute);
  BeginPeriod(table_.BackwardPeriod(stage));
  CheckResident(stage);
}

void ChunkManager::PostBackward(int stage) {
  if (backward_done_[static_cast<size_t>(stage)]) return;
  backward_done_[static_cast<size_t>(stage)] = true;
  const int period = table_.BackwardPeriod(stage);
  EndPeriod(period);
  for (int i : table_.stages[static_cast<size_t>(stage)].params) {
    ManagedTensor& t = table_.tensors[static_cast<size_t>(i)];
    --t.uses_left;
    t.state = Transition(t.name, t.state,
                         t.uses_left > 0 ? TensorState::kHoldAfterBackward : TensorState::kReadyForReduce);
  }
  for (int c : table_.stage_chunks[static_cast<size_t>(stage)]) {
    Chunk& chunk = table_.chunk(c);
    bool ready = !chunk.grad_reduced;
    for (int i : chunk.tensors) {
      ready = ready && table_.tensors[static_cast<size_t>(i)].state == TensorState::kReadyForReduce;
    }
    if (!ready) continue;
    // Complete: what no claim wrote is zero.
    for (int i : chunk.tensors) {
      ManagedTensor& t = table_.tensors[static_cast<size_t>(i)];
      if (!t.grad_unwritten) continue;
      t.param.grad().zero_();
      t.grad_unwritten = false;
    }
    // Before the last micro-batch the gradients are not complete: they
    // stay to be added to.
    if (last_micro_batch()) {
      reducer_.Reduce(chunk);
    } else {
      reducer_.Hold(chunk);
    }
  }
  policy_.ReleaseAfterPeriod(period);
}

at::Tensor ChunkManager::Recompute(int stage, const at::Tensor& input) {
  const uint64_t before = device_->allocated_bytes();
  at::Tensor output = stage_fns_[static_cast<size_t>(stage)](input);
  // What the stage keeps for its backward, beside its input: what
  // recomputing it saves between its forward and its backward.
  const uint64_t after = device_->allocated_bytes();
  tracer_.RecordKept(stage, after > before ? after - before : 0);
  return output;
}

absl::Status ChunkManager::FinishBackward() {
  for (int s = table_.stage_count() - 1; s >= 0; --s) {
    if (!backward_started_[static_cast<size_t>(s)]) PreBackward(s);
    PostBackward(s);
  }
  reducer_.Finish();
  for (const ManagedTensor& t : table_.tensors) {
    if (t.state != TensorState::kReadyForReduce) {
      throw std::logic_error(absl::StrCat(t.name, " is ", TensorStateName(t.state), " after the backward"));
    }
  }
  if (!last_micro_batch()) {
    // The next micro-batch runs the same periods again.
    ++micro_batch_;
    for (ManagedTensor& t : table_.tensors) {
      t.state = Transition(t.name, t.state, TensorState::kHold);
      t.uses_left = t.backward_uses;
    }
    backward_started_.assign(table_.stages.size(), false);
    backward_done_.assign(table_.stages.size(), false);
    return absl::OkStatus();
  }
  ++micro_batch_;
  if (!tracer_.warmup()) return absl::OkStatus();
  return policy_.PlanAfterWarmup();
}

void ChunkManager::BeginStep(const std::vector<int64_t>& batch_shape, int micro_batches) {
  if (micro_batches < 1) throw std::logic_error(absl::StrCat("a step of ", micro_batches, " micro-batches"));
  stats_ = StepMemoryStats();
  micro_batches_ = micro_batches;
  micro_batch_ = 0;
  // The micro-batch count is part of what is traced: with more than one,
  // chunks updated on the device keep their gradients through the forward
  // periods, which the plan must count.
  std::vector<int64_t> traced = batch_shape;
  traced.push_back(micro_batches);
  const bool new_shape = tracer_.BeginStep(traced);
  policy_.BeginStep(new_shape, micro_batches > 1);
  stats_.warmup = tracer_.warmup();
  stats_.recomputed_stages = tracer_.RecomputedStages();
  for (Chunk& chunk : table_.chunks) {
    chunk.grad_started = false;
    chunk.grad_reduced = false;
  }
  for (ManagedTensor& t : table_.tensors) {
    t.uses_left = t.backward_uses;
    t.grad_unwritten = false;
  }
  backward_started_.assign(table_.stages.size(), false);
  backward_done_.assign(table_.stages.size(), false);
  reducer_.BeginStep();
  if (store_.disk() != nullptr) disk_at_step_start_ = store_.disk()->stats();
}

OptimizerResult ChunkManager::OptimizerStep(int64_t step, double lr, double max_grad_norm, double loss_scale) {
  if (micro_batch_ != micro_batches_) {
    throw std::logic_error(absl::StrCat("optimizer step after ", micro_batch_, " of ", micro_batches_, " micro-batches"));
  }
  const int period = table_.OptimizerPeriod();
  BeginPeriod(period);
  const OptimizerResult result = optimizer_.Step(step, lr, max_grad_norm, loss_scale, reducer_.SquaredNorm());
  stats_.overlapped_updates = result.overlapped_updates;
  for (ManagedTensor& t : table_.tensors) t.state = Transition(t.name, t.state, TensorState::kHold);
  EndPeriod(period);
  return result;
}

StepMemoryStats ChunkManager::EndStep() {
  for (const Chunk& chunk : table_.chunks) {
    bool on_device = false;
    for (const Payload& p : chunk.payloads) {
      const int k = static_cast<int>(p.kind);
      if (p.resident) {
        stats_.device_bytes[k] += p.bytes;
        on_device = true;
      }
      if (p.host.defined() && p.home == Tier::kHost) stats_.host_bytes[k] += p.host.nbytes();
      if (p.disk_file >= 0) stats_.disk_bytes[k] += store_.disk()->file_bytes(p.disk_file);
    }
    on_device ? ++stats_.device_chunks : ++stats_.host_chunks;
    if (chunk.payload(PayloadKind::kOptimizer).home == Tier::kDisk ||
        chunk.payload(PayloadKind::kGrad).home == Tier::kDisk) {
      ++stats_.disk_chunks;
    }
  }
  // The staging slots hold optimizer states (and gradients) on their way to
  // and from disk.
  stats_.host_bytes[static_cast<int>(PayloadKind::kOptimizer)] += store_.staging_bytes();
  stats_.host_model_bytes = store_.host_model_bytes();
  stats_.peak_host_model_bytes = store_.peak_host_model_bytes();
  if (store_.disk() != nullptr) {
    const DiskStats now = store_.disk()->stats();
    stats_.disk_to_host_bytes = now.read_bytes - disk_at_step_start_.read_bytes;
    stats_.host_to_disk_bytes = now.write_bytes - disk_at_step_start_.write_bytes;
    stats_.disk_read_seconds = now.read_seconds - disk_at_step_start_.read_seconds;
    stats_.disk_write_seconds = now.write_seconds - disk_at_step_start_.write_seconds;
    stats_.disk_wait_seconds = now.wait_seconds - disk_at_step_start_.wait_seconds;
  }
  const TransferTimes transfers = device_->TakeTransferTimes();
  stats_.transfer_seconds += transfers.stall_seconds;
  stats_.copy_seconds = transfers.copy_seconds;
  tracer_.EndStep();
  for (auto& fn : stage_fns_) fn = nullptr;
  return stats_;
}

PlacementReport ChunkManager::Placement() const {
  PlacementReport r;
  r.device = device_->name();
  r.policy = PolicyName(options_.policy);
  r.warmup = tracer_.warmup() || !policy_.applied();
  r.capacity_bytes = device_->capacity_bytes();
  r.limit_bytes = policy_.MakePlanInput().limit_bytes;
  r.host_budget_bytes = options_.host_budget_bytes;
  r.disk_dir = disk_dir();
  r.disk_budget_bytes = store_.disk() != nullptr ? options_.disk_budget_bytes : 0;
  r.planned_host_bytes = tier_plan_.host_bytes;
  r.planned_disk_bytes = tier_plan_.disk_bytes;
  r.planned_disk_read_bytes = tier_plan_.disk_read_bytes_per_step;
  r.planned_disk_write_bytes = tier_plan_.disk_write_bytes_per_step;
  r.chunk_elements = layout_.chunk_elements;
  r.chunk_waste_fraction = layout_.waste_fraction();
  r.planned_traffic_bytes = policy_.plan().traffic_bytes;
  r.recomputed_stages = tracer_.RecomputedStages();
  for (const Chunk& chunk : table_.chunks) {
    std::string state;
    for (int i : chunk.tensors) {
      const std::string s = TensorStateName(table_.tensors[static_cast<size_t>(i)].state);
      if (s == "compute" || state == "compute") {
        state = "compute";
      } else if (state.empty()) {
        state = s;
      } else if (state != s) {
        state = "mixed";
      }
    }
    for (const Payload& p : chunk.payloads) {
      PayloadReport pr;
      pr.id = absl::StrCat(std::string(1, PayloadKindName(p.kind)[0]), chunk.id);
      pr.kind = p.kind;
      pr.chunk = chunk.id;
      const bool host_side = p.host_valid || p.disk_valid;
      pr.tier = p.resident && p.device_valid && host_side ? "both"
                : p.resident && p.device_valid          ? "device"
                : p.host_valid                          ? "host"
                : p.disk_valid                          ? "disk"
                                                        : "none";
      pr.bytes = p.host_bytes();
      pr.device_bytes = p.resident ? p.bytes : 0;
      pr.host_bytes = p.host.defined() && p.home == Tier::kHost ? p.host.nbytes() : 0;
      pr.disk_bytes = p.disk_file >= 0 ? store_.disk()->file_bytes(p.disk_file) : 0;
      pr.home = TierName(p.home);
      pr.state = state;
      pr.chunk_class = chunk.chunk_class;
      pr.tensors = static_cast<int>(chunk.tensors.size());
      r.payloads.push_back(pr);
    }
  }
  const std::vector<uint64_t>& predicted = tracer_.predicted();
  const std::vector<uint64_t>& traced = tracer_.warmup_trace();
  const std::vector<PeriodTracer::Measure>& measured = tracer_.step_periods();
  for (int p = 0; p < table_.cycle(); ++p) {
    const size_t i = static_cast<size_t>(p);
    PeriodReport period;
    period.name = PeriodName(p);
    // As planned: the trace adjusted for the blocks that recompute now.
    period.non_model_bytes = i < predicted.size() ? predicted[i] : i < traced.size() ? traced[i] : 0;
    period.chunks = table_.period_chunks[i];
    if (i < traced.size()) period.warmup_non_model_bytes = traced[i];
    if (i < measured.size()) {
      const PeriodTracer::Measure& m = measured[i];
      period.step_non_model_bytes = m.non_model_bytes;
      period.step_device_model_bytes = m.device_model_bytes;
      period.evictions = m.evictions;
      period.fetches = m.fetches;
      period.prefetches = m.prefetches;
    }
    r.trace.push_back(period);
  }
  return r;
}

std::vector<at::Tensor> ChunkManager::ParameterValues() const {
  optimizer_.WaitForUpdates();
  return values_.Masters();
}

absl::Status ChunkManager::SaveState(const StateSink& sink) const {
  optimizer_.WaitForUpdates();
  return values_.Save(sink);
}

uint64_t ChunkManager::StateBytes() const { return values_.StateBytes(); }

bool ChunkManager::StateSnapshotFits() const {
  if (options_.host_budget_bytes == 0) return true;
  const uint64_t used = tier_plan_.host_steady_bytes;
  return used < options_.host_budget_bytes && StateBytes() <= options_.host_budget_bytes - used;
}

absl::Status ChunkManager::RestoreState(uint64_t size, const StateSource& source) {
  optimizer_.WaitForUpdates();
  policy_.ForgetPeriod();
  return values_.Restore(size, source);
}

std::string ChunkManager::ExplainOutOfMemory(const std::string& what) const {
  const std::vector<uint64_t>& traced = tracer_.warmup_trace();
  size_t largest = 0;
  for (size_t p = 0; p < traced.size(); ++p) {
    if (traced[p] > traced[largest]) largest = p;
  }
  std::string advice =
      options_.policy == MemoryOptions::Policy::kStatic
          ? "Static keeps its fixed split however little room is left; use memory.policy: auto, "
            "which moves chunks as the step needs them, or raise memory.device_budget"
          : options_.recompute == MemoryOptions::Recompute::kNone ||
                    options_.recompute == MemoryOptions::Recompute::kEvery
                ? "Recompute activations (memory.recompute: auto), use a smaller train.batch_size or "
                  "model.seq_len, or raise memory.device_budget"
                : "Use a smaller train.batch_size or model.seq_len, or raise memory.device_budget";
  return absl::StrCat("out of device memory in period '", PeriodName(tracer_.current_period()), "' (",
                      tracer_.warmup() ? "warm-up" : "steady", " step, ", PolicyName(options_.policy),
                      " policy): ", Mib(table_.DeviceModelBytes()), " of model data on the device of ",
                      Mib(device_->capacity_bytes()), "; the largest non-model period so far is '",
                      PeriodName(static_cast<int>(largest)), "' with ",
                      Mib(traced.empty() ? 0 : traced[largest]), ". ", advice, " (", what, ")");
}

}  // namespace ferry
