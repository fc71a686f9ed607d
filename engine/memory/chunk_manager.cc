#include "engine/memory/chunk_manager.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/memory/eviction.h"
#include "engine/memory/simulated_device.h"

namespace ferry {
namespace {

constexpr int kKinds = 3;

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

LowType LowTypeOf(c10::ScalarType t) {
  return t == at::kHalf ? LowType::kFloat16 : t == at::kBFloat16 ? LowType::kBFloat16 : LowType::kFloat32;
}

}  // namespace

struct ChunkManager::Chunk {
  int id = 0;
  int64_t capacity = 0;
  int64_t used = 0;
  std::vector<int> tensors;
  std::vector<DecaySegment> decay;
  ChunkClass chunk_class = ChunkClass::kStreamed;
  Payload payloads[kKinds];
  // This step: gradients zeroed and accumulating; complete and reduced.
  bool grad_started = false;
  bool grad_reduced = false;
  // The optimizer states hold values (after the first update).
  bool optimizer_initialized = false;
  bool device_homed() const { return chunk_class == ChunkClass::kDeviceHomed; }
};

struct ChunkManager::ManagedTensor {
  std::string name;
  at::Tensor param;
  int chunk = 0;
  int64_t offset = 0;
  int64_t numel = 0;
  TensorState state = TensorState::kFree;
  int backward_uses = 0;
  int uses_left = 0;
  bool replicated = true;
};

ChunkManager::ChunkManager(MemoryDevice* device, MemoryOptions options, OptimizerOptions optimizer)
    : device_(device),
      store_(device, options.host_budget_bytes),
      simd_(BestSimdPath()),
      options_(options),
      optimizer_(optimizer) {}

ChunkManager::~ChunkManager() = default;

absl::StatusOr<std::unique_ptr<ChunkManager>> ChunkManager::Create(
    MemoryDevice* device, std::vector<ManagedParam> params, std::vector<StageParams> stages,
    const MemoryOptions& options, const OptimizerOptions& optimizer, ManagerGroups parallel) {
  if (params.empty() || stages.empty()) return absl::InvalidArgumentError("no parameters to manage");
  std::unique_ptr<ChunkManager> m(new ChunkManager(device, options, optimizer));
  m->groups_ = parallel;
  std::vector<int64_t> numels;
  for (const ManagedParam& p : params) numels.push_back(p.tensor.numel());
  // A tensor's group is the first stage using it: chunks follow stages.
  std::vector<int> groups(params.size(), static_cast<int>(stages.size()));
  for (size_t s = stages.size(); s-- > 0;) {
    for (int i : stages[s].params) {
      if (i >= 0 && i < static_cast<int>(params.size())) groups[static_cast<size_t>(i)] = static_cast<int>(s);
    }
  }
  ChunkSearchOptions search;
  search.step_elements = options.chunk_step_elements > 0 ? options.chunk_step_elements : 1024;
  search.max_chunks = options.max_chunks;
  absl::StatusOr<ChunkLayout> layout = ChooseChunkLayout(numels, groups, options.chunk_elements, search);
  if (!layout.ok()) return layout.status();
  m->layout_ = *std::move(layout);
  m->stages_ = std::move(stages);

  m->chunks_.resize(static_cast<size_t>(m->layout_.chunk_count()));
  for (int c = 0; c < m->layout_.chunk_count(); ++c) {
    Chunk& chunk = m->chunks_[static_cast<size_t>(c)];
    chunk.id = c;
    chunk.capacity = m->layout_.capacity[static_cast<size_t>(c)];
    chunk.used = m->layout_.used[static_cast<size_t>(c)];
    for (int k = 0; k < kKinds; ++k) {
      Payload& p = chunk.payloads[k];
      p.kind = static_cast<PayloadKind>(k);
      p.chunk = c;
      // Optimizer states: both moments, and in mixed precision the fp32
      // master weights after them.
      p.numel = p.kind == PayloadKind::kOptimizer ? (m->mixed() ? 3 : 2) * chunk.capacity : chunk.capacity;
      p.dtype = p.kind == PayloadKind::kOptimizer ? c10::kFloat : optimizer.param_dtype;
      p.bytes = static_cast<uint64_t>(p.numel) * c10::elementSize(p.dtype);
      m->store_.InitDevice(p);
    }
  }
  // Where each chunk's host side lives; the model's values as built count
  // against the host budget until they move into chunks.
  TierInput tiers;
  for (const Chunk& chunk : m->chunks_) {
    tiers.param_bytes.push_back(chunk.payloads[0].bytes);
    tiers.grad_bytes.push_back(chunk.payloads[1].bytes);
    tiers.optimizer_bytes.push_back(chunk.payloads[2].bytes);
  }
  // The model as built (less what is initialised straight into its chunk),
  // and the largest scratch an initialisation takes.
  uint64_t built_bytes = 0, init_scratch_bytes = 0;
  for (const ManagedParam& p : params) {
    if (p.init) {
      init_scratch_bytes = std::max(init_scratch_bytes, p.init_scratch_bytes);
    } else {
      built_bytes += static_cast<uint64_t>(p.tensor.numel()) * p.tensor.element_size();
    }
  }
  tiers.construction_bytes = built_bytes + init_scratch_bytes;
  tiers.masters_with_optimizer = m->mixed();
  tiers.host_limit_bytes = options.host_budget_bytes;
  tiers.disk_limit_bytes = options.disk_dir.empty() ? 0 : options.disk_budget_bytes;
  tiers.disk_dir = options.disk_dir;
  m->tier_plan_ = PlanTiers(tiers);
  if (!m->tier_plan_.feasible) return absl::ResourceExhaustedError(m->tier_plan_.problem);
  std::vector<Payload*> on_disk;
  for (size_t c = 0; c < m->chunks_.size(); ++c) {
    if (m->tier_plan_.optimizer_tier[c] == Tier::kDisk) {
      on_disk.push_back(&m->chunks_[c].payloads[static_cast<int>(PayloadKind::kOptimizer)]);
    }
  }
  absl::Status disk = m->store_.OpenDisk(options, on_disk);
  if (!disk.ok()) return disk;
  m->store_.AddHostBytes(static_cast<int64_t>(tiers.construction_bytes));
  m->tensors_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorSlot& slot = m->layout_.slots[i];
    ManagedTensor& t = m->tensors_[i];
    t.name = params[i].name;
    t.param = params[i].tensor;
    t.chunk = slot.chunk;
    t.offset = slot.offset;
    t.numel = slot.numel;
    t.replicated = params[i].replicated;
    Chunk& chunk = m->chunks_[static_cast<size_t>(slot.chunk)];
    chunk.tensors.push_back(static_cast<int>(i));
    if (params[i].decay) chunk.decay.push_back({slot.offset, slot.numel});
  }
  m->stage_chunks_.resize(m->stages_.size());
  for (size_t s = 0; s < m->stages_.size(); ++s) {
    std::set<int> chunks;
    for (int i : m->stages_[s].params) {
      if (i < 0 || i >= static_cast<int>(params.size())) {
        return absl::InvalidArgumentError(absl::StrCat("stage ", m->stages_[s].name, " names parameter ", i));
      }
      chunks.insert(m->tensors_[static_cast<size_t>(i)].chunk);
      ++m->tensors_[static_cast<size_t>(i)].backward_uses;
    }
    m->stage_chunks_[s].assign(chunks.begin(), chunks.end());
  }
  m->period_chunks_.assign(static_cast<size_t>(m->cycle()), {});
  for (int s = 0; s < m->stage_count(); ++s) {
    m->period_chunks_[static_cast<size_t>(m->ForwardPeriod(s))] = m->stage_chunks_[static_cast<size_t>(s)];
    m->period_chunks_[static_cast<size_t>(m->BackwardPeriod(s))] = m->stage_chunks_[static_cast<size_t>(s)];
  }

  // The parameters' values go to the chunks' host-side copies a chunk at a
  // time; each parameter then becomes a view of its chunk's device copy
  // (its gradient of the gradient chunk's), which frees the memory it was
  // built in before the next chunk takes more.
  absl::Status status = CallTorch("placing parameters in chunks", [&]() -> absl::Status {
    // Disk-homed masters are written behind, through the staging buffers in
    // turn.
    std::vector<std::pair<Payload*, DiskStore::Ticket>> writing(m->store_.staging_count(), {nullptr, 0});
    int next_buffer = 0;
    for (Chunk& chunk : m->chunks_) {
      if (options.values_from_checkpoint) {
        m->TakeOver(chunk, params);
        continue;
      }
      Payload& p = chunk.payloads[static_cast<int>(PayloadKind::kParam)];
      Payload& o = chunk.payloads[static_cast<int>(PayloadKind::kOptimizer)];
      m->store_.EnsureHost(p);
      HostAllocationScope host;
      // fp32: the parameter chunk is the master. Mixed precision: the master
      // sits with the optimizer states, the parameters are its rounded copy.
      at::Tensor master = p.host;
      if (m->mixed()) {
        if (o.home == Tier::kDisk) {
          auto& [previous, ticket] = writing[static_cast<size_t>(next_buffer)];
          if (previous != nullptr) m->store_.FinishStore(*previous, ticket);
          m->store_.AttachStaging(o, next_buffer);
          next_buffer = (next_buffer + 1) % static_cast<int>(m->store_.staging_count());
        } else {
          m->store_.EnsureHost(o);
        }
        o.host.zero_();
        chunk.optimizer_initialized = true;
        master = o.host.narrow(0, 2 * chunk.capacity, chunk.capacity);
      }
      master.zero_();
      for (int i : chunk.tensors) {
        const ManagedTensor& t = m->tensors_[static_cast<size_t>(i)];
        const ManagedParam& param = params[static_cast<size_t>(i)];
        if (param.init) {
          param.init(master.narrow(0, t.offset, t.numel));
        } else {
          master.narrow(0, t.offset, t.numel).copy_(t.param.detach().reshape({-1}));
        }
      }
      if (m->mixed()) {
        p.host.copy_(master);
        o.host_valid = true;
        if (o.home == Tier::kDisk) writing[static_cast<size_t>(o.staging)] = {&o, m->store_.StartStore(o)};
      }
      p.host_valid = true;
      m->TakeOver(chunk, params);
    }
    for (auto& [o, ticket] : writing) {
      if (o != nullptr) m->store_.FinishStore(*o, ticket);
    }
    m->store_.AddHostBytes(-static_cast<int64_t>(init_scratch_bytes));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  m->plan_.classes.assign(m->chunks_.size(), ChunkClass::kStreamed);
  m->ApplyPlan();
  m->plan_applied_ = false;
  m->recompute_ = m->InitialRecompute();
  m->traced_recompute_ = m->recompute_;
  m->stage_fns_.resize(m->stages_.size());
  m->kept_activation_bytes_.assign(m->stages_.size(), 0);
  m->input_bytes_.assign(m->stages_.size(), 0);
  m->backward_started_.assign(m->stages_.size(), false);
  m->backward_done_.assign(m->stages_.size(), false);
  return m;
}

void ChunkManager::TakeOver(const Chunk& chunk, const std::vector<ManagedParam>& params) {
  for (int i : chunk.tensors) {
    ManagedTensor& t = tensors_[static_cast<size_t>(i)];
    const std::vector<int64_t> shape = t.param.sizes().vec();
    if (!params[static_cast<size_t>(i)].init) {
      store_.AddHostBytes(-static_cast<int64_t>(t.param.numel() * t.param.element_size()));
    }
    t.param.set_data(chunk.payloads[0].device.narrow(0, t.offset, t.numel).view(shape));
    t.param.mutable_grad() = chunk.payloads[1].device.narrow(0, t.offset, t.numel).view(shape);
    t.state = Transition(t.name, t.state, TensorState::kHold);
  }
}

Payload& ChunkManager::payload(int chunk, PayloadKind kind) {
  return chunks_[static_cast<size_t>(chunk)].payloads[static_cast<int>(kind)];
}

const Payload& ChunkManager::payload(int chunk, PayloadKind kind) const {
  return chunks_[static_cast<size_t>(chunk)].payloads[static_cast<int>(kind)];
}

std::string ChunkManager::PeriodName(int period) const {
  if (period < 0) return "set-up";
  if (period == OptimizerPeriod()) return "optimizer";
  if (period < stage_count()) return "forward " + stages_[static_cast<size_t>(period)].name;
  const size_t stage = static_cast<size_t>(2 * stage_count() - 1 - period);
  // A recomputing stage's backward period includes re-running its forward.
  return (recompute_.size() > stage && recompute_[stage] ? "recompute+backward " : "backward ") +
         stages_[stage].name;
}

// --- Moving payloads. ---

bool ChunkManager::Preserve(const Payload& p) const {
  const Chunk& chunk = chunks_[static_cast<size_t>(p.chunk)];
  switch (p.kind) {
    case PayloadKind::kParam:
      return true;
    case PayloadKind::kGrad:
      // Live from the first backward use until reduced, and for a chunk
      // updated on the device until the optimizer has used it.
      return chunk.grad_started && (!chunk.grad_reduced || (plan_applied_ && chunk.device_homed()));
    case PayloadKind::kOptimizer:
      return chunk.optimizer_initialized;  // from the start in mixed precision: it holds the master
  }
  return true;
}

void ChunkManager::Evict(Payload& p) {
  if (!p.resident) return;
  const bool saved = p.host_valid || (p.home == Tier::kDisk && p.disk_valid);
  if (p.device_valid && !saved && Preserve(p)) {
    store_.HostBuffer(p);
    const auto start = std::chrono::steady_clock::now();
    device_->CopyToHost(p.device, p.host);
    if (p.home == Tier::kDisk) device_->SynchronizeTransfers();  // before the write reads it
    stats_.transfer_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats_.device_to_host_bytes += p.bytes;
    p.host_valid = true;
    store_.WriteHome(p);
  }
  store_.Release(p);
}

void ChunkManager::Fetch(Payload& p, bool prefetch) {
  Chunk& chunk = chunks_[static_cast<size_t>(p.chunk)];
  if (p.resident && p.device_valid) {
    if (!prefetch && p.prefetched) {
      ++stats_.prefetch_hits;
      p.prefetched = false;
    }
    return;
  }
  store_.Materialize(p);
  if (p.kind == PayloadKind::kGrad && !chunk.grad_started) {
    p.device.zero_();  // this step's gradients start here
    chunk.grad_started = true;
    p.host_valid = false;
  } else if (p.kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) {
    p.device.zero_();
  } else if (p.host_valid || (p.home == Tier::kDisk && p.disk_valid)) {
    const bool staged = !p.host_valid;
    if (staged) store_.LoadHome(p);
    const auto start = std::chrono::steady_clock::now();
    device_->CopyToDevice(p.host, p.device);
    if (staged) {
      // The staging buffer is reused at once: the copy must be done.
      device_->SynchronizeTransfers();
      store_.DetachStaging(p);
    }
    stats_.transfer_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats_.host_to_device_bytes += p.bytes;
    if (current_period_ >= 0 && static_cast<size_t>(current_period_) < step_periods_.size()) {
      PeriodMeasure& m = step_periods_[static_cast<size_t>(current_period_)];
      ++(prefetch ? m.prefetches : m.fetches);
    }
    // Fetched on demand: a prefetch would have saved the wait.
    if (!prefetch && !warmup_) ++stats_.prefetch_misses;
  } else {
    throw std::logic_error(absl::StrCat("chunk ", p.chunk, " ", PayloadKindName(p.kind),
                                        ": no current copy to fetch"));
  }
  p.device_valid = true;
  p.prefetched = prefetch;
}

uint64_t ChunkManager::DeviceModelBytes() const {
  uint64_t bytes = 0;
  for (const Chunk& chunk : chunks_) {
    for (const Payload& p : chunk.payloads) {
      if (p.resident) bytes += p.bytes;
    }
  }
  return bytes;
}

uint64_t ChunkManager::Predicted(int period) const {
  return period >= 0 && period < static_cast<int>(predicted_.size())
             ? predicted_[static_cast<size_t>(period)]
             : 0;
}

void ChunkManager::MakeRoom(uint64_t bytes, int period, const std::vector<Payload*>& keep) {
  // Room for the period's predicted non-model memory too, even when its
  // chunks are all here already: chunks kept from earlier periods must not
  // crowd out the activations.
  if (warmup_ || options_.policy != MemoryOptions::Policy::kAuto) return;
  const double limit = double(device_->capacity_bytes()) * (1.0 - options_.margin);
  const double in_use = double(Predicted(period)) + double(DeviceModelBytes());
  if (in_use + double(bytes) <= limit) return;
  const uint64_t short_by = static_cast<uint64_t>(in_use + double(bytes) - limit);
  std::vector<EvictionCandidate> candidates;
  std::vector<Payload*> handles;
  for (Chunk& chunk : chunks_) {
    for (Payload& p : chunk.payloads) {
      if (!p.resident || p.pinned || std::find(keep.begin(), keep.end(), &p) != keep.end()) continue;
      EvictionCandidate c;
      c.id = static_cast<int>(handles.size());
      c.bytes = p.bytes;
      c.next_use_distance = NextUseDistance(p.uses, period, cycle());
      c.dead = !p.device_valid || !Preserve(p);
      c.clean = c.dead || p.host_valid || p.disk_valid;
      candidates.push_back(c);
      handles.push_back(&p);
    }
  }
  for (int victim : ChooseVictims(std::move(candidates), short_by)) {
    Evict(*handles[static_cast<size_t>(victim)]);
    ++stats_.evictions;
    if (static_cast<size_t>(period) < step_periods_.size()) ++step_periods_[static_cast<size_t>(period)].evictions;
  }
}

std::vector<Payload*> ChunkManager::Needed(int period) {
  std::vector<Payload*> needed;
  if (period == OptimizerPeriod()) {
    if (!plan_applied_) return needed;
    for (Chunk& chunk : chunks_) {
      if (!chunk.device_homed()) continue;
      for (Payload& p : chunk.payloads) needed.push_back(&p);
    }
    return needed;
  }
  const bool backward = period >= stage_count();
  for (int c : period_chunks_[static_cast<size_t>(period)]) {
    needed.push_back(&payload(c, PayloadKind::kParam));
    if (backward) needed.push_back(&payload(c, PayloadKind::kGrad));
  }
  return needed;
}

void ChunkManager::Prepare(int period, const std::vector<Payload*>& needed) {
  uint64_t to_allocate = 0;
  for (const Payload* p : needed) {
    if (!p->resident) to_allocate += p->bytes;
  }
  MakeRoom(to_allocate, period, needed);
  for (Payload* p : needed) Fetch(*p, /*prefetch=*/false);
  device_->ComputeWaitsForTransfers();
}

void ChunkManager::Prefetch(int period) {
  if (warmup_ || options_.policy != MemoryOptions::Policy::kAuto || !options_.prefetch) return;
  const int next = (period + 1) % cycle();
  const double limit = double(device_->capacity_bytes()) * (1.0 - options_.margin);
  double room = limit - double(std::max(Predicted(period), Predicted(next))) - double(DeviceModelBytes());
  for (Payload* p : Needed(next)) {
    // Only what has a host copy to bring: gradients start on the device.
    if (p->resident || !p->host_valid || p->kind == PayloadKind::kGrad) continue;
    if (double(p->bytes) > room) continue;
    Fetch(*p, /*prefetch=*/true);
    room -= double(p->bytes);
  }
}

// --- Periods. ---

void ChunkManager::BeginPeriod(int period, const std::vector<Payload*>& needed) {
  current_period_ = period;
  Prepare(period, needed);
  Prefetch(period);
  device_->ResetPeak();
  period_model_bytes_ = DeviceModelBytes();
  if (static_cast<size_t>(period) < step_periods_.size()) {
    PeriodMeasure& m = step_periods_[static_cast<size_t>(period)];
    m.device_model_bytes = std::max(m.device_model_bytes, period_model_bytes_);
  }
}

void ChunkManager::EndPeriod(int period) {
  const uint64_t peak = device_->peak_allocated_bytes();
  const uint64_t non_model = peak > period_model_bytes_ ? peak - period_model_bytes_ : 0;
  const size_t p = static_cast<size_t>(period);
  if (warmup_) {
    non_model_[p] = std::max(non_model_[p], non_model);
  } else {
    const double predicted = double(predicted_[p]);
    const double error = std::fabs(double(non_model) - predicted) / std::max(predicted, double(1 << 20));
    stats_.prediction_error = std::max(stats_.prediction_error, error);
    predicted_[p] = std::max(predicted_[p], non_model);
  }
  stats_.peak_non_model_bytes = std::max(stats_.peak_non_model_bytes, non_model);
  stats_.peak_device_bytes = std::max(stats_.peak_device_bytes, peak);
  if (p < step_periods_.size()) {
    step_periods_[p].non_model_bytes = std::max(step_periods_[p].non_model_bytes, non_model);
  }
  current_period_ = -1;
}

void ChunkManager::SetStates(int stage, TensorState to) {
  for (int i : stages_[static_cast<size_t>(stage)].params) {
    ManagedTensor& t = tensors_[static_cast<size_t>(i)];
    t.state = Transition(t.name, t.state, to);
  }
}

void ChunkManager::ReleaseAfterPeriod(int period) {
  // Warm-up keeps only what the current period needs, so that the trace
  // measures non-model memory with room to spare; static streams the chunks
  // it does not pin. Auto keeps everything until room is short.
  if (!warmup_ && options_.policy == MemoryOptions::Policy::kAuto) return;
  for (int c : period_chunks_[static_cast<size_t>(period)]) {
    Payload& p = payload(c, PayloadKind::kParam);
    if (!p.pinned) Evict(p);
  }
}

at::Tensor ChunkManager::RunStage(int stage, const at::Tensor& input,
                                  const std::function<at::Tensor(const at::Tensor&)>& fn) {
  const int period = ForwardPeriod(stage);
  SetStates(stage, TensorState::kCompute);
  BeginPeriod(period, Needed(period));
  const int64_t self = reinterpret_cast<int64_t>(this);
  at::Tensor x = input.requires_grad() ? StageHook::apply(input, self, stage, /*post=*/true) : input;
  at::Tensor y;
  if (recompute_[static_cast<size_t>(stage)]) {
    stage_fns_[static_cast<size_t>(stage)] = fn;
    input_bytes_[static_cast<size_t>(stage)] = static_cast<uint64_t>(x.numel()) * x.element_size();
    y = CheckpointStage::apply(x, self, stage, device_->compute_device(), &stage_fns_[static_cast<size_t>(stage)]);
  } else {
    y = fn(x);
  }
  if (y.requires_grad()) y = StageHook::apply(y, self, stage, /*post=*/false);
  EndPeriod(period);
  SetStates(stage, TensorState::kHold);
  ReleaseAfterPeriod(period);
  return y;
}

void ChunkManager::PreBackward(int stage) {
  backward_started_[static_cast<size_t>(stage)] = true;
  const int period = BackwardPeriod(stage);
  for (int i : stages_[static_cast<size_t>(stage)].params) {
    ManagedTensor& t = tensors_[static_cast<size_t>(i)];
    t.state = Transition(t.name, t.state, TensorState::kCompute);
  }
  BeginPeriod(period, Needed(period));
}

void ChunkManager::PostBackward(int stage) {
  if (backward_done_[static_cast<size_t>(stage)]) return;
  backward_done_[static_cast<size_t>(stage)] = true;
  const int period = BackwardPeriod(stage);
  EndPeriod(period);
  for (int i : stages_[static_cast<size_t>(stage)].params) {
    ManagedTensor& t = tensors_[static_cast<size_t>(i)];
    --t.uses_left;
    t.state = Transition(t.name, t.state,
                         t.uses_left > 0 ? TensorState::kHoldAfterBackward : TensorState::kReadyForReduce);
  }
  for (int c : stage_chunks_[static_cast<size_t>(stage)]) {
    Chunk& chunk = chunks_[static_cast<size_t>(c)];
    bool ready = !chunk.grad_reduced;
    for (int i : chunk.tensors) {
      ready = ready && tensors_[static_cast<size_t>(i)].state == TensorState::kReadyForReduce;
    }
    if (ready) Reduce(chunk);
  }
  ReleaseAfterPeriod(period);
}

void ChunkManager::Reduce(Chunk& chunk) {
  chunk.grad_reduced = true;
  if (groups_.data == nullptr || groups_.data->size() == 1) {
    CompleteReduce(chunk);
    return;
  }
  // One all-reduce in flight at a time, overlapping the backward of the
  // stages before this chunk's: finish the previous one, start this one.
  // Its gradients stay put on the device until it is done.
  FinishPendingReduce();
  Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
  g.pinned = true;
  pending_chunk_ = &chunk;
  pending_reduce_ = groups_.data->StartAllReduce(g.device.narrow(0, 0, chunk.used));
}

void ChunkManager::FinishPendingReduce() {
  if (pending_chunk_ == nullptr) return;
  Chunk& chunk = *pending_chunk_;
  pending_chunk_ = nullptr;
  std::unique_ptr<PendingCollective> work = std::move(pending_reduce_);
  work->Wait();
  Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
  g.pinned = false;
  // The mean over the data ranks' shares of the batch.
  g.device.narrow(0, 0, chunk.used).div_(groups_.data->size());
  CompleteReduce(chunk);
}

void ChunkManager::CompleteReduce(Chunk& chunk) {
  Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
  at::Tensor grads = g.device.narrow(0, 0, chunk.used);
  // In fp32 whatever the gradients' type; an overflow shows as inf or NaN.
  // Reduced-precision gradients are widened a piece at a time: a norm in
  // fp32 of the whole chunk would first copy it whole to fp32 (a 2-byte
  // chunk's size twice over, on the device).
  auto sq_norm = [](const at::Tensor& t) {
    if (t.scalar_type() == at::kFloat) {
      const double n = at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kFloat).item<double>();
      return n * n;
    }
    constexpr int64_t kPiece = int64_t{1} << 22;
    at::Tensor sum = at::zeros({}, t.options().dtype(at::kDouble));
    for (int64_t i = 0; i < t.numel(); i += kPiece) {
      const at::Tensor piece = t.narrow(0, i, std::min(kPiece, t.numel() - i));
      sum.add_(at::linalg_vector_norm(piece, 2, c10::nullopt, false, at::kFloat).to(at::kDouble).square());
    }
    return sum.item<double>();
  };
  double sq = sq_norm(grads);
  const int tensor_ranks = groups_.tensor != nullptr ? groups_.tensor->size() : 1;
  if (tensor_ranks > 1) {
    // Summed over the tensor group later: a replicated tensor's share is
    // 1/T on each rank, so that it counts once.
    double replicated = 0;
    for (int i : chunk.tensors) {
      const ManagedTensor& t = tensors_[static_cast<size_t>(i)];
      if (t.replicated) replicated += sq_norm(grads.narrow(0, t.offset, t.numel));
    }
    sq -= (1.0 - 1.0 / tensor_ranks) * replicated;
  }
  grad_sq_sum_ += sq;
  if (plan_applied_ && chunk.device_homed()) return;
  // The optimizer states are on the host: so go the gradients.
  store_.EnsureHost(g);
  const auto start = std::chrono::steady_clock::now();
  device_->CopyToHost(g.device, g.host);
  stats_.transfer_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.device_to_host_bytes += g.bytes;
  g.host_valid = true;
  store_.Release(g);
}

at::Tensor ChunkManager::Recompute(int stage, const at::Tensor& input) {
  const uint64_t before = device_->allocated_bytes();
  at::Tensor output = stage_fns_[static_cast<size_t>(stage)](input);
  // What the stage keeps for its backward, beside its input: what
  // recomputing it saves between its forward and its backward.
  const uint64_t after = device_->allocated_bytes();
  const uint64_t kept = after > before ? after - before : 0;
  uint64_t& recorded = kept_activation_bytes_[static_cast<size_t>(stage)];
  recorded = std::max(recorded, kept);
  return output;
}

std::vector<int> ChunkManager::RecomputedStages() const {
  std::vector<int> stages;
  for (size_t s = 0; s < recompute_.size(); ++s) {
    if (recompute_[s]) stages.push_back(static_cast<int>(s));
  }
  return stages;
}

std::vector<bool> ChunkManager::InitialRecompute() const {
  std::vector<bool> r(stages_.size(), false);
  int block = 0;
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (!stages_[s].recomputable) continue;
    switch (options_.recompute) {
      case MemoryOptions::Recompute::kNone:
        break;
      case MemoryOptions::Recompute::kAll:
      case MemoryOptions::Recompute::kAuto:  // the warm-up measures every block
        r[s] = true;
        break;
      case MemoryOptions::Recompute::kEvery:
        r[s] = block % std::max(1, options_.recompute_every) == 0;
        break;
    }
    ++block;
  }
  return r;
}

uint64_t ChunkManager::KeepCost(int stage) const {
  // Beyond the input, which a recomputing stage keeps anyway.
  const size_t i = static_cast<size_t>(stage);
  return kept_activation_bytes_[i] > input_bytes_[i] ? kept_activation_bytes_[i] - input_bytes_[i] : 0;
}

std::vector<uint64_t> ChunkManager::TraceWith(const std::vector<bool>& recompute) const {
  std::vector<uint64_t> trace = non_model_;
  for (int s = 0; s < stage_count(); ++s) {
    const size_t i = static_cast<size_t>(s);
    if (!traced_recompute_[i] || recompute[i]) continue;
    // Kept instead of recomputed: its activations stay from its forward to
    // its backward.
    const uint64_t extra = KeepCost(s);
    for (int p = ForwardPeriod(s); p < BackwardPeriod(s); ++p) trace[static_cast<size_t>(p)] += extra;
  }
  return trace;
}

absl::Status ChunkManager::FinishBackward() {
  for (int s = stage_count() - 1; s >= 0; --s) {
    if (!backward_started_[static_cast<size_t>(s)]) PreBackward(s);
    PostBackward(s);
  }
  FinishPendingReduce();
  for (const ManagedTensor& t : tensors_) {
    if (t.state != TensorState::kReadyForReduce) {
      throw std::logic_error(absl::StrCat(t.name, " is ", TensorStateName(t.state),
                                          " after the backward"));
    }
  }
  if (!warmup_) return absl::OkStatus();
  return PlanAfterWarmup();
}

PlanInput ChunkManager::MakePlanInput() const {
  PlanInput in;
  const double margin = options_.policy == MemoryOptions::Policy::kAuto ? options_.margin : 0.0;
  in.limit_bytes = static_cast<uint64_t>(double(device_->capacity_bytes()) * (1.0 - margin));
  in.non_model_bytes = non_model_;
  in.period_chunks = period_chunks_;
  in.forward_periods = stage_count();
  in.backward_periods = stage_count();
  const bool cpu_update = device_->compute_device().is_cpu();
  for (const Chunk& chunk : chunks_) {
    in.param_bytes.push_back(chunk.payloads[0].bytes);
    in.grad_bytes.push_back(chunk.payloads[1].bytes);
    in.optimizer_bytes.push_back(chunk.payloads[2].bytes);
    // A device-side update with LibTorch ops allocates the denominator
    // (fp32) and, in mixed precision, fp32 gradients; the simulated device
    // runs the CPU kernel in place.
    const uint64_t fp32 = static_cast<uint64_t>(chunk.capacity) * 4;
    in.update_temp_bytes.push_back(cpu_update ? 0 : mixed() ? 2 * fp32 : fp32);
  }
  return in;
}

Plan ChunkManager::PlanFor(const PlanInput& in) const {
  return options_.policy == MemoryOptions::Policy::kStatic
             ? PlanStatic(in, options_.static_param_host_fraction, options_.static_optimizer_host_fraction)
             : PlanAuto(in);
}

absl::Status ChunkManager::PlanAfterWarmup() {
  PlanInput in = MakePlanInput();
  if (options_.recompute == MemoryOptions::Recompute::kAuto) {
    // Keep (stop recomputing) the blocks that save least first, the later on
    // ties (their activations live for fewer periods), while the step still
    // fits: the fewest recomputed blocks.
    std::vector<int> candidates;
    for (int s = 0; s < stage_count(); ++s) {
      if (recompute_[static_cast<size_t>(s)]) candidates.push_back(s);
    }
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
      return KeepCost(a) != KeepCost(b) ? KeepCost(a) < KeepCost(b) : a > b;
    });
    std::vector<bool> chosen = recompute_;
    for (int s : candidates) {
      std::vector<bool> trial = chosen;
      trial[static_cast<size_t>(s)] = false;
      PlanInput at = in;
      at.non_model_bytes = TraceWith(trial);
      if (PlanFor(at).feasible) chosen = trial;
    }
    recompute_ = chosen;
    in.non_model_bytes = TraceWith(recompute_);
  }
  predicted_ = in.non_model_bytes;
  plan_ = PlanFor(in);
  // Static keeps to its split even where the trace says it will not fit: it
  // then fails with the device's own out-of-memory error.
  if (plan_.feasible || options_.policy == MemoryOptions::Policy::kStatic) return absl::OkStatus();
  const int p = plan_.binding_period;
  const uint64_t need = plan_.need_bytes[static_cast<size_t>(p)];
  const uint64_t activations = in.non_model_bytes[static_cast<size_t>(p)];
  const size_t largest = static_cast<size_t>(
      std::max_element(in.non_model_bytes.begin(), in.non_model_bytes.end()) - in.non_model_bytes.begin());
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory: the step does not fit the device even with every chunk streamed: period '",
      PeriodName(p), "' needs ", Mib(need), " (", Mib(activations),
      " of activations and workspace, ", Mib(need - activations),
      " of its chunks' parameters and gradients) but the device has ", Mib(in.limit_bytes), " (",
      Mib(device_->capacity_bytes()), " less a ", options_.margin * 100,
      "% margin); the largest non-model period is '", PeriodName(static_cast<int>(largest)),
      "' with ", Mib(in.non_model_bytes[largest]), ". Use a smaller train.batch_size or model.seq_len, ",
      options_.recompute == MemoryOptions::Recompute::kAll ||
              options_.recompute == MemoryOptions::Recompute::kAuto
          ? ""
          : "recompute activations (memory.recompute: auto), ",
      "or raise memory.device_budget"));
}

void ChunkManager::ApplyPlan() {
  const int optimizer = OptimizerPeriod();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    chunk.chunk_class = plan_.classes[c];
    const bool homed = chunk.device_homed();
    std::vector<int> stage_periods;
    for (int s = 0; s < stage_count(); ++s) {
      const auto& used = stage_chunks_[static_cast<size_t>(s)];
      if (std::find(used.begin(), used.end(), static_cast<int>(c)) != used.end()) {
        stage_periods.push_back(ForwardPeriod(s));
        stage_periods.push_back(BackwardPeriod(s));
      }
    }
    std::sort(stage_periods.begin(), stage_periods.end());
    Payload& p = chunk.payloads[static_cast<int>(PayloadKind::kParam)];
    Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
    Payload& o = chunk.payloads[static_cast<int>(PayloadKind::kOptimizer)];
    p.uses = stage_periods;
    g.uses.clear();
    for (int period : stage_periods) {
      if (period >= stage_count()) g.uses.push_back(period);
    }
    o.uses.clear();
    if (homed) {
      p.uses.push_back(optimizer);
      g.uses.push_back(optimizer);
      o.uses.push_back(optimizer);
    }
    p.pinned = chunk.chunk_class != ChunkClass::kStreamed;
    o.pinned = homed;
    g.pinned = false;
  }
  plan_applied_ = true;
}

void ChunkManager::Demote() {
  // Back to the warm-up's placement: every chunk's optimizer on the host.
  for (Chunk& chunk : chunks_) {
    for (Payload& p : chunk.payloads) {
      p.pinned = false;
      Evict(p);
    }
  }
  plan_.classes.assign(chunks_.size(), ChunkClass::kStreamed);
  ApplyPlan();
  plan_applied_ = false;
}

void ChunkManager::BeginStep(const std::vector<int64_t>& batch_shape) {
  stats_ = StepMemoryStats();
  if (batch_shape != traced_shape_) {
    if (!traced_shape_.empty()) Demote();
    warmup_ = true;
    traced_shape_ = batch_shape;
    non_model_.assign(static_cast<size_t>(cycle()), 0);
    recompute_ = InitialRecompute();
    traced_recompute_ = recompute_;
    kept_activation_bytes_.assign(stages_.size(), 0);
  } else if (!plan_applied_) {
    ApplyPlan();
  }
  stats_.warmup = warmup_;
  stats_.recomputed_stages = RecomputedStages();
  step_periods_.assign(static_cast<size_t>(cycle()), PeriodMeasure());
  for (Chunk& chunk : chunks_) {
    chunk.grad_started = false;
    chunk.grad_reduced = false;
  }
  for (ManagedTensor& t : tensors_) t.uses_left = t.backward_uses;
  backward_started_.assign(stages_.size(), false);
  backward_done_.assign(stages_.size(), false);
  grad_sq_sum_ = 0;
  if (store_.disk() != nullptr) disk_at_step_start_ = store_.disk()->stats();
}

void ChunkManager::UpdateOnCpu(Chunk& chunk, bool device_copies, const AdamWHyper& hyper) {
  Payload& p = chunk.payloads[static_cast<int>(PayloadKind::kParam)];
  Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
  Payload& o = chunk.payloads[static_cast<int>(PayloadKind::kOptimizer)];
  const at::Tensor& params = device_copies ? p.device : p.host;
  const at::Tensor& states = device_copies ? o.device : o.host;
  const at::Tensor& grads = device_copies ? g.device : g.host;
  CpuAdamBuffers b;
  b.master = mixed() ? states.data_ptr<float>() + 2 * chunk.capacity : params.data_ptr<float>();
  b.grad = grads.data_ptr();
  b.grad_type = LowTypeOf(g.dtype);
  b.exp_avg = states.data_ptr<float>();
  b.exp_avg_sq = states.data_ptr<float>() + chunk.capacity;
  if (mixed()) {
    b.copy = params.data_ptr();
    b.copy_type = LowTypeOf(p.dtype);
  }
  b.numel = chunk.used;
  CpuAdamWStep(b, chunk.decay, hyper, simd_);
}

OptimizerResult ChunkManager::OptimizerStep(int64_t step, double lr, double max_grad_norm, double loss_scale) {
  const int period = OptimizerPeriod();
  BeginPeriod(period, Needed(period));
  if (groups_.tensor != nullptr && groups_.tensor->size() > 1) {
    at::Tensor sum = at::full({1}, grad_sq_sum_, at::kDouble);
    groups_.tensor->AllReduce(sum);
    grad_sq_sum_ = sum.item<double>();
  }
  OptimizerResult result;
  if (!std::isfinite(grad_sq_sum_)) {
    // Overflow: drop this step's gradients and leave every weight and state
    // as it was.
    result.grad_norm = std::numeric_limits<double>::infinity();
    result.skipped = true;
    for (Chunk& chunk : chunks_) {
      Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
      g.host_valid = false;
      store_.Release(g);
    }
  } else {
    result.grad_norm = std::sqrt(grad_sq_sum_) / loss_scale;
    double clip = 1.0;
    if (max_grad_norm > 0) {
      // As torch::nn::utils::clip_grad_norm_ computes it.
      const double coef = max_grad_norm / (result.grad_norm + 1e-6);
      if (coef < 1.0) clip = coef;
    }
    AdamWHyper hyper;
    hyper.lr = lr;
    hyper.beta1 = optimizer_.beta1;
    hyper.beta2 = optimizer_.beta2;
    hyper.eps = optimizer_.eps;
    hyper.weight_decay = optimizer_.weight_decay;
    hyper.step = step;
    hyper.grad_scale = clip / loss_scale;
    device_->SynchronizeTransfers();
    const bool cpu_device = device_->compute_device().is_cpu();
    // Chunks whose optimizer states are on disk are updated through the
    // staging buffers as a pipeline: while chunk k is updated, chunk k+1's
    // states are being read and chunk k-1's written. Chunks go in forward
    // order, so the next forward's first chunks are the first ready.
    std::vector<Chunk*> from_disk;
    for (Chunk& chunk : chunks_) {
      Payload& o = chunk.payloads[static_cast<int>(PayloadKind::kOptimizer)];
      if (o.home == Tier::kDisk && !(plan_applied_ && chunk.device_homed())) from_disk.push_back(&chunk);
    }
    const size_t buffers = static_cast<size_t>(store_.staging_count());
    std::vector<DiskStore::Ticket> reads(from_disk.size(), 0), writes(from_disk.size(), 0);
    auto states = [&](size_t k) -> Payload& {
      return from_disk[k]->payloads[static_cast<int>(PayloadKind::kOptimizer)];
    };
    auto start_read = [&](size_t k) {
      if (k < from_disk.size()) reads[k] = store_.StartLoad(states(k), static_cast<int>(k % buffers));
    };
    // Reads run ahead by buffers - 1 chunks: the last buffer is the one
    // being written behind.
    for (size_t k = 0; k + 1 < buffers; ++k) start_read(k);
    size_t next_disk = 0;
    for (Chunk& chunk : chunks_) {
      Payload& p = chunk.payloads[static_cast<int>(PayloadKind::kParam)];
      Payload& g = chunk.payloads[static_cast<int>(PayloadKind::kGrad)];
      Payload& o = chunk.payloads[static_cast<int>(PayloadKind::kOptimizer)];
      const int64_t n = chunk.used;
      if (plan_applied_ && chunk.device_homed()) {
        if (cpu_device) {
          // The simulated device is CPU memory: the same kernel as the host's,
          // so where a chunk lives never changes the numbers.
          UpdateOnCpu(chunk, /*device_copies=*/true, hyper);
        } else if (mixed()) {
          at::Tensor master = o.device.narrow(0, 2 * chunk.capacity, n);
          FlatAdamWStep(master, g.device.narrow(0, 0, n).to(at::kFloat), o.device.narrow(0, 0, n),
                        o.device.narrow(0, chunk.capacity, n), chunk.decay, hyper);
          p.device.narrow(0, 0, n).copy_(master);
        } else {
          FlatAdamWStep(p.device.narrow(0, 0, n), g.device.narrow(0, 0, n), o.device.narrow(0, 0, n),
                        o.device.narrow(0, chunk.capacity, n), chunk.decay, hyper);
        }
        // The device copies are the only current ones: the host (and the
        // disk) no longer mirror them.
        store_.ReleaseHost(p);
        store_.ReleaseHost(o);
        o.disk_valid = false;
        store_.ReleaseHost(g);
        store_.Release(g);  // used up; the next backward starts it afresh
      } else {
        if (!p.host_valid || !g.host_valid) {
          throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": host update without current host copies"));
        }
        const bool on_disk = o.home == Tier::kDisk;
        const size_t k = next_disk;
        if (on_disk) {
          store_.FinishLoad(o, reads[k]);
        } else {
          store_.EnsureHost(o);
          if (!chunk.optimizer_initialized) {
            HostAllocationScope host;
            o.host.zero_();
          }
        }
        UpdateOnCpu(chunk, /*device_copies=*/false, hyper);
        o.host_valid = true;
        g.host_valid = false;
        p.device_valid = false;
        if (on_disk) {
          writes[k] = store_.StartStore(o);
          ++next_disk;
          // Chunk k-1's buffer is the one chunk k+buffers-1 reads into.
          if (k >= 1) store_.FinishStore(states(k - 1), writes[k - 1]);
          start_read(k + buffers - 1);
        }
        if (p.pinned) {
          Fetch(p, /*prefetch=*/false);  // pinned: refresh the device copy now
        } else {
          store_.Release(p);
        }
      }
      chunk.optimizer_initialized = true;
    }
    if (!from_disk.empty()) store_.FinishStore(states(from_disk.size() - 1), writes.back());
  }
  for (ManagedTensor& t : tensors_) t.state = Transition(t.name, t.state, TensorState::kHold);
  EndPeriod(period);
  return result;
}

StepMemoryStats ChunkManager::EndStep() {
  for (const Chunk& chunk : chunks_) {
    bool on_device = false;
    for (const Payload& p : chunk.payloads) {
      const int k = static_cast<int>(p.kind);
      if (p.resident) {
        stats_.device_bytes[k] += p.bytes;
        on_device = true;
      }
      if (p.host.defined() && p.home == Tier::kHost) stats_.host_bytes[k] += p.bytes;
      if (p.disk_file >= 0) stats_.disk_bytes[k] += store_.disk()->file_bytes(p.disk_file);
    }
    on_device ? ++stats_.device_chunks : ++stats_.host_chunks;
    if (chunk.payloads[static_cast<int>(PayloadKind::kOptimizer)].home == Tier::kDisk) ++stats_.disk_chunks;
  }
  // The staging buffers hold optimizer states on their way to and from disk.
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
  warmup_ = false;
  for (auto& fn : stage_fns_) fn = nullptr;
  return stats_;
}

PlacementReport ChunkManager::Placement() const {
  PlacementReport r;
  r.device = device_->name();
  r.policy = PolicyName(options_.policy);
  r.warmup = warmup_ || !plan_applied_;
  r.capacity_bytes = device_->capacity_bytes();
  r.limit_bytes = MakePlanInput().limit_bytes;
  r.host_budget_bytes = options_.host_budget_bytes;
  r.disk_dir = disk_dir();
  r.disk_budget_bytes = store_.disk() != nullptr ? options_.disk_budget_bytes : 0;
  r.planned_host_bytes = tier_plan_.host_bytes;
  r.planned_disk_bytes = tier_plan_.disk_bytes;
  r.planned_disk_read_bytes = tier_plan_.disk_read_bytes_per_step;
  r.planned_disk_write_bytes = tier_plan_.disk_write_bytes_per_step;
  r.chunk_elements = layout_.chunk_elements;
  r.chunk_waste_fraction = layout_.waste_fraction();
  r.planned_traffic_bytes = plan_.traffic_bytes;
  r.recomputed_stages = RecomputedStages();
  for (const Chunk& chunk : chunks_) {
    std::string state;
    for (int i : chunk.tensors) {
      const std::string s = TensorStateName(tensors_[static_cast<size_t>(i)].state);
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
      pr.bytes = p.bytes;
      pr.device_bytes = p.resident ? p.bytes : 0;
      pr.host_bytes = p.host.defined() && p.home == Tier::kHost ? p.bytes : 0;
      pr.disk_bytes = p.disk_file >= 0 ? store_.disk()->file_bytes(p.disk_file) : 0;
      pr.home = TierName(p.home);
      pr.state = state;
      pr.chunk_class = chunk.chunk_class;
      pr.tensors = static_cast<int>(chunk.tensors.size());
      r.payloads.push_back(pr);
    }
  }
  for (int p = 0; p < cycle(); ++p) {
    PeriodReport period;
    period.name = PeriodName(p);
    // As planned: the trace adjusted for the blocks that recompute now.
    period.non_model_bytes = p < static_cast<int>(predicted_.size()) ? predicted_[static_cast<size_t>(p)]
                             : p < static_cast<int>(non_model_.size()) ? non_model_[static_cast<size_t>(p)]
                                                                       : 0;
    period.chunks = period_chunks_[static_cast<size_t>(p)];
    if (p < static_cast<int>(non_model_.size())) period.warmup_non_model_bytes = non_model_[static_cast<size_t>(p)];
    if (p < static_cast<int>(step_periods_.size())) {
      const PeriodMeasure& m = step_periods_[static_cast<size_t>(p)];
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
  HostAllocationScope host;
  device_->SynchronizeTransfers();
  std::vector<at::Tensor> values;
  for (const ManagedTensor& t : tensors_) {
    const Chunk& chunk = chunks_[static_cast<size_t>(t.chunk)];
    // The master: the parameter chunk in fp32, after the moments otherwise.
    const Payload& m = chunk.payloads[static_cast<int>(mixed() ? PayloadKind::kOptimizer : PayloadKind::kParam)];
    const int64_t base = mixed() ? 2 * chunk.capacity : 0;
    store_.WithCurrentCopy(m, [&](const at::Tensor& current) {
      values.push_back(current.narrow(0, base + t.offset, t.numel)
                           .to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                           .view(t.param.sizes()));
    });
  }
  return values;
}

namespace {

constexpr char kStateMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'K', '1'};

absl::Status PutInt(const ChunkManager::StateSink& sink, int64_t v) { return sink(&v, sizeof v); }

}  // namespace

uint64_t ChunkManager::StateBytes() const {
  uint64_t size = sizeof kStateMagic + 2 * sizeof(int64_t);
  for (const Chunk& chunk : chunks_) {
    size += 2 * sizeof(int64_t);
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      if (kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) continue;
      size += sizeof(int64_t) + chunk.payloads[static_cast<int>(kind)].bytes;
    }
  }
  return size;
}

bool ChunkManager::StateSnapshotFits() const {
  if (options_.host_budget_bytes == 0) return true;
  const uint64_t used = tier_plan_.host_steady_bytes;
  return used < options_.host_budget_bytes && StateBytes() <= options_.host_budget_bytes - used;
}

absl::Status ChunkManager::SaveState(const StateSink& sink) const {
  HostAllocationScope host;
  device_->SynchronizeTransfers();
  // One payload at a time, from wherever its current copy is: a host copy
  // is written in place, a device one through a host copy of that payload,
  // a disk one through a staging buffer.
  RETURN_IF_ERROR(sink(kStateMagic, sizeof kStateMagic));
  RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(chunks_.size())));
  RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(optimizer_.param_dtype)));
  for (const Chunk& chunk : chunks_) {
    RETURN_IF_ERROR(PutInt(sink, chunk.capacity));
    RETURN_IF_ERROR(PutInt(sink, chunk.optimizer_initialized ? 1 : 0));
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      const Payload& p = chunk.payloads[static_cast<int>(kind)];
      if (kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) continue;
      RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(p.bytes)));
      absl::Status written;
      store_.WithCurrentCopy(p, [&](const at::Tensor& copy) {
        const at::Tensor current = copy.to(at::kCPU).contiguous();
        written = sink(current.data_ptr(), p.bytes);
      });
      RETURN_IF_ERROR(written);
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkManager::RestoreState(uint64_t size, const StateSource& source) {
  auto mismatch = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: ", what, "; it was saved for another model, precision or parallel layout"));
  };
  uint64_t left = size;
  // Reads `n` bytes, or says why not: a short state is another layout's.
  auto take = [&](void* data, size_t n) -> absl::Status {
    if (n > left) return mismatch("truncated chunk state");
    left -= n;
    return source(data, n);
  };
  auto take_int = [&](int64_t* v) { return take(v, sizeof *v); };
  char magic[sizeof kStateMagic];
  if (size < sizeof magic) return absl::InvalidArgumentError("checkpoint: not a chunk state");
  RETURN_IF_ERROR(take(magic, sizeof magic));
  if (std::memcmp(magic, kStateMagic, sizeof magic) != 0) {
    return absl::InvalidArgumentError("checkpoint: not a chunk state");
  }
  int64_t count = 0, dtype = 0;
  RETURN_IF_ERROR(take_int(&count));
  RETURN_IF_ERROR(take_int(&dtype));
  if (count != static_cast<int64_t>(chunks_.size())) {
    return mismatch(absl::StrCat(count, " chunks, this run has ", chunks_.size()));
  }
  if (dtype != static_cast<int64_t>(optimizer_.param_dtype)) return mismatch("parameters of another type");
  HostAllocationScope host;
  for (Chunk& chunk : chunks_) {
    int64_t capacity = 0, initialized = 0;
    RETURN_IF_ERROR(take_int(&capacity));
    RETURN_IF_ERROR(take_int(&initialized));
    if (capacity != chunk.capacity) {
      return mismatch(absl::StrCat("chunk ", chunk.id, " holds ", capacity, " elements, here ", chunk.capacity));
    }
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      Payload& p = chunk.payloads[static_cast<int>(kind)];
      if (kind == PayloadKind::kOptimizer && initialized == 0) {
        if (p.resident) store_.Release(p);
        p.host_valid = false;
        p.disk_valid = false;
        continue;
      }
      int64_t bytes = 0;
      RETURN_IF_ERROR(take_int(&bytes));
      if (bytes != static_cast<int64_t>(p.bytes) || static_cast<uint64_t>(bytes) > left) {
        return mismatch(absl::StrCat("chunk ", chunk.id, " ", PayloadKindName(kind), " has another size"));
      }
      if (p.resident) store_.Release(p);
      store_.HostBuffer(p);
      RETURN_IF_ERROR(take(p.host.data_ptr(), static_cast<size_t>(bytes)));
      p.host_valid = true;
      store_.WriteHome(p);
    }
    chunk.optimizer_initialized = initialized != 0;
  }
  if (left != 0) return mismatch("trailing bytes in the chunk state");
  return absl::OkStatus();
}

std::string ChunkManager::ExplainOutOfMemory(const std::string& what) const {
  size_t largest = 0;
  for (size_t p = 0; p < non_model_.size(); ++p) {
    if (non_model_[p] > non_model_[largest]) largest = p;
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
  return absl::StrCat("out of device memory in period '", PeriodName(current_period_), "' (",
                      warmup_ ? "warm-up" : "steady", " step, ", PolicyName(options_.policy),
                      " policy): ", Mib(DeviceModelBytes()), " of model data on the device of ",
                      Mib(device_->capacity_bytes()), "; the largest non-model period so far is '",
                      PeriodName(static_cast<int>(largest)), "' with ",
                      Mib(non_model_.empty() ? 0 : non_model_[largest]), ". ", advice, " (", what, ")");
}

}  // namespace ferry
