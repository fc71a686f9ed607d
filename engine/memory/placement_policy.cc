#include "engine/memory/placement_policy.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/memory/eviction.h"

namespace ferry {
namespace {

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", double(bytes) / (1 << 20)); }

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

PlacementPolicy::PlacementPolicy(MemoryDevice* device, ChunkTable* table, PeriodTracer* tracer, PayloadMover* mover,
                                 StepMemoryStats* stats, const MemoryOptions& options, bool mixed_precision,
                                 bool device_update_temps, Communicator* weight_shards)
    : device_(device),
      table_(table),
      tracer_(tracer),
      mover_(mover),
      stats_(stats),
      options_(options),
      mixed_(mixed_precision),
      device_update_temps_(device_update_temps),
      weight_shards_(weight_shards) {
  plan_.classes.assign(table_->chunks.size(), ChunkClass::kStreamed);
  Apply();
  applied_ = false;
}

std::vector<Payload*> PlacementPolicy::Needed(int period) {
  std::vector<Payload*> needed;
  if (period == table_->OptimizerPeriod()) {
    for (Chunk& chunk : table_->chunks) {
      if (!chunk.device_homed()) continue;
      for (Payload& p : chunk.payloads) needed.push_back(&p);
    }
    return needed;
  }
  const bool backward = table_->IsBackward(period);
  for (int c : table_->period_chunks[static_cast<size_t>(period)]) {
    needed.push_back(&table_->payload(c, PayloadKind::kParam));
    if (backward) needed.push_back(&table_->payload(c, PayloadKind::kGrad));
  }
  return needed;
}

uint64_t PlacementPolicy::MakeRoom(uint64_t bytes, int period, const std::vector<Payload*>& keep,
                                   uint64_t homeward) {
  // Room for the period's predicted non-model memory too, even when its
  // chunks are all here already: chunks kept from earlier periods must not
  // crowd out the activations.
  const double limit = double(device_->capacity_bytes()) * (1.0 - options_.margin);
  const auto in_use = [&] {
    return double(tracer_->Predicted(period)) + double(table_->DeviceModelBytes()) + double(unusable_bytes_);
  };
  if (!adaptive()) {
    // The warm-up and static placement, which predict nothing, wait for
    // every copy home.
    if (device_->releasing_bytes() > 0) WaitForReleases();
    return 0;
  }
  // Memory given back since the last period with its copy home written
  // behind (the backward's gradients, sent to the host as each completes)
  // is in use until that copy is done. Rather than compute waiting for it,
  // payloads that need no copy home leave in its place, farthest next use
  // first: the period's room never waits on a copy just issued, and the
  // next period gets the memory back. Decided from what was sent, not from
  // how far the copies have got.
  uint64_t evicted = 0;
  const double over = in_use() + double(bytes) + double(homeward) - limit;
  if (homeward > 0 && over > 0) {
    evicted += EvictFrom(static_cast<uint64_t>(over), period, keep, /*pinned=*/false, /*clean_only=*/true);
  }
  // Where the period may still need memory that waits for copies, they
  // finish first.
  const uint64_t releasing = device_->releasing_bytes();
  if (releasing > 0 && in_use() + double(bytes) + double(releasing) > limit) WaitForReleases();
  if (in_use() + double(bytes) <= limit) return evicted;
  return evicted + EvictFor(static_cast<uint64_t>(in_use() + double(bytes) - limit), period, keep);
}

uint64_t PlacementPolicy::EvictFor(uint64_t short_by, int period, const std::vector<Payload*>& keep) {
  // What the plan streams first; what it keeps on the device only when that
  // is not enough (the device has less room than the plan was made for: its
  // fragments). A pinned payload evicted comes back when next needed.
  uint64_t evicted = EvictFrom(short_by, period, keep, /*pinned=*/false);
  if (evicted < short_by) evicted += EvictFrom(short_by - evicted, period, keep, /*pinned=*/true);
  return evicted;
}

uint64_t PlacementPolicy::EvictFrom(uint64_t short_by, int period, const std::vector<Payload*>& keep, bool pinned,
                                    bool clean_only) {
  std::vector<EvictionCandidate> candidates;
  std::vector<Payload*> handles;
  for (Chunk& chunk : table_->chunks) {
    for (Payload& p : chunk.payloads) {
      if (!p.resident || p.pinned != pinned || std::find(keep.begin(), keep.end(), &p) != keep.end()) continue;
      EvictionCandidate c;
      c.id = static_cast<int>(handles.size());
      c.bytes = p.bytes;
      c.next_use_distance = NextUseDistance(p.uses, period, table_->cycle());
      c.dead = !p.device_valid || !table_->Preserve(p);
      c.clean = c.dead || p.host_valid || p.disk_valid;
      // Only what leaves at once: no copy home, no update to wait for.
      if (clean_only && (!c.clean || chunk.update != nullptr)) continue;
      candidates.push_back(c);
      handles.push_back(&p);
    }
  }
  uint64_t evicted = 0;
  for (int victim : ChooseVictims(std::move(candidates), short_by)) {
    Payload& p = *handles[static_cast<size_t>(victim)];
    mover_->Evict(p, table_->Preserve(p));
    evicted += p.bytes;
    ++stats_->evictions;
    tracer_->CountEviction(period);
  }
  // An evicted payload's device memory is free once its copy home is done:
  // the room is made when they are (nothing went home from a clean one).
  if (!clean_only && device_->releasing_bytes() > 0) WaitForReleases();
  return evicted;
}

bool PlacementPolicy::TryAfterReleases(const std::function<void()>& allocate) {
  try {
    allocate();
    return true;
  } catch (const c10::OutOfMemoryError&) {
  }
  // Memory given back may still be waiting for its copies home: refused
  // only if refused once they are done, so that whether (and how) a
  // refusal is handled never depends on how fast the copies ran.
  WaitForReleases();
  try {
    allocate();
    return true;
  } catch (const c10::OutOfMemoryError&) {
    return false;
  }
}

void PlacementPolicy::Allocate(Payload& p, int period, const std::vector<Payload*>& keep) {
  const auto materialize = [&] { mover_->Materialize(p); };
  if (TryAfterReleases(materialize)) return;
  // The device refused memory the plan made room for: what the plan cannot
  // see took it (a caching allocator's cached segments, fragments too small
  // for a chunk that it does not report). First the device gives back what
  // it holds unused; refused again, more chunks leave, farthest next use
  // first. With nothing left to evict, the error stands.
  ++stats_->allocation_retries;
  device_->ReleaseCachedMemory();
  while (!TryAfterReleases(materialize)) {
    ++stats_->allocation_retries;
    if (EvictFor(p.bytes, period, keep) == 0) {
      materialize();  // throws the device's error (or fits, at the last moment)
      return;
    }
  }
}

void PlacementPolicy::WaitForReleases() {
  const auto start = std::chrono::steady_clock::now();
  device_->SynchronizeTransfers();
  stats_->transfer_seconds += SecondsSince(start);
}

void PlacementPolicy::Prepare(int period, const std::vector<Payload*>& needed) {
  FinishGathers();
  unusable_bytes_ = device_->unusable_bytes();
  uint64_t to_allocate = 0;
  for (const Payload* p : needed) {
    if (!p->resident) to_allocate += p->bytes;
  }
  homeward_bytes_ = mover_->TakeHomewardBytes();
  MakeRoom(to_allocate, period, needed, homeward_bytes_);
  for (Payload* p : needed) {
    Allocate(*p, period, needed);
    mover_->Fetch(*p, /*prefetch=*/false);
  }
  // Compute waits for the copies that fill what it needs, and only those:
  // the period's own fetches and any prefetched earlier, while the next
  // period's prefetches go on beside it. The device times how long compute
  // stood waiting (the step's exposed transfer, ChunkManager::EndStep).
  for (Payload* p : needed) device_->ComputeWaitsFor(p->device_filled);
  GatherWeights(period);
  Prefetch(period);
  StartGathers(period);
  device_->ComputeBegins();
}

void PlacementPolicy::Prefetch(int period) {
  if (!adaptive() || !options_.prefetch) return;
  const int next = (period + 1) % table_->cycle();
  const double limit = double(device_->capacity_bytes()) * (1.0 - options_.margin);
  // Memory whose copies home were just issued (see MakeRoom) is no room.
  double room = limit - double(std::max(tracer_->Predicted(period), tracer_->Predicted(next))) -
                double(table_->DeviceModelBytes()) - double(unusable_bytes_) - double(homeward_bytes_);
  std::vector<Payload*> keep;  // what this period and the next use, once needed
  for (Payload* p : Needed(next)) {
    // Only what has a host copy to bring: gradients start on the device.
    if ((p->resident && p->device_valid) || !p->host_valid || p->kind == PayloadKind::kGrad) continue;
    // A chunk whose update still runs beside the step is fetched once it is
    // done, by the period that needs it.
    if (Pending(table_->chunk(p->chunk).update)) continue;
    // A resident copy to refresh (a pinned chunk's parameters after an
    // update on the host) needs no room.
    const double needs = p->resident ? 0.0 : double(p->bytes);
    // Short of room, what the next period's own preparation would evict
    // leaves now, so that the copy runs beside this period's compute: among
    // what neither period uses and needs no copy home, the farthest next
    // use first (the device full of kept weights, each period's weights
    // would otherwise come only when it waits for them).
    if (needs > room) {
      if (keep.empty()) {
        keep = Needed(period);
        const std::vector<Payload*> upcoming = Needed(next);
        keep.insert(keep.end(), upcoming.begin(), upcoming.end());
      }
      room += double(EvictFrom(static_cast<uint64_t>(needs - room), period, keep, /*pinned=*/false,
                               /*clean_only=*/true));
    }
    if (needs > room) continue;
    // Memory still waiting for its copies home is room only once they are
    // done: a prefetch that needs it waits for them (as MakeRoom does), so
    // what is prefetched does not depend on how fast the copies run.
    if (needs > room - double(device_->releasing_bytes())) WaitForReleases();
    if (!TryAfterReleases([&] { mover_->Fetch(*p, /*prefetch=*/true); })) {
      // Refused although the plan has room (see Allocate): the period
      // that needs it fetches it, evicting if it must.
      ++stats_->allocation_retries;
      break;
    }
    room -= needs;
  }
}

void PlacementPolicy::GatherWeights(int period) {
  const int previous = last_period_;
  last_period_ = period;
  if (weight_shards_ == nullptr || period == table_->OptimizerPeriod()) return;
  const std::vector<int> none;
  const bool computed = previous >= 0 && previous < table_->OptimizerPeriod();
  const std::vector<int>& before = computed ? table_->period_chunks[static_cast<size_t>(previous)] : none;
  const std::vector<int>& ahead = gathering_for_ == period ? gathered_ahead_ : none;
  for (int c : table_->period_chunks[static_cast<size_t>(period)]) {
    Chunk& chunk = table_->chunk(c);
    Payload& p = chunk.payload(PayloadKind::kParam);
    if (!p.host_sharded()) continue;
    // Kept whole from the period before (which every rank kept alike) or
    // gathered ahead for this one (where every rank did), else gathered now
    // -- also where every rank released it alike (a new batch shape's
    // warm-up, values restored).
    const bool kept = std::find(before.begin(), before.end(), c) != before.end() ||
                      std::find(ahead.begin(), ahead.end(), c) != ahead.end();
    if (!kept || !p.device_whole) {
      chunk.GatherShards(weight_shards_, p.device);
      p.device_whole = true;
    }
  }
  gathered_ahead_.clear();
  gathering_for_ = -1;
}

void PlacementPolicy::StartGathers(int period) {
  const int next = (period + 1) % table_->cycle();
  if (weight_shards_ == nullptr || !adaptive() || !options_.prefetch || period >= table_->OptimizerPeriod() ||
      next >= table_->OptimizerPeriod()) {
    return;
  }
  // The chunks the next period would gather: the same on every rank.
  const std::vector<int>& now = table_->period_chunks[static_cast<size_t>(period)];
  std::vector<int> chunks;
  bool here = true;
  for (int c : table_->period_chunks[static_cast<size_t>(next)]) {
    const Payload& p = table_->payload(c, PayloadKind::kParam);
    if (!p.host_sharded() || std::find(now.begin(), now.end(), c) != now.end()) continue;
    chunks.push_back(c);
    here = here && p.resident && p.device_valid;
  }
  if (chunks.empty()) return;
  // Whether each rank's own plan prefetched their shards: all or none start.
  at::Tensor ready = at::full({1}, here ? 1.0 : 0.0, at::kDouble);
  weight_shards_->AllReduce(ready);
  if (ready.item<double>() < weight_shards_->size()) return;
  for (int c : chunks) {
    Payload& p = table_->payload(c, PayloadKind::kParam);
    device_->ComputeWaitsFor(p.device_filled);  // the shard's copy, before the gather sends it
    gathering_.push_back(table_->chunk(c).StartGatherShards(weight_shards_, p.device));
    ++stats_->gathers_ahead;
  }
  gathered_ahead_ = std::move(chunks);
  gathering_for_ = next;
}

void PlacementPolicy::FinishGathers() {
  for (std::unique_ptr<PendingCollective>& gather : gathering_) gather->Wait();
  gathering_.clear();
  for (int c : gathered_ahead_) table_->payload(c, PayloadKind::kParam).device_whole = true;
}

void PlacementPolicy::ReleaseAfterPeriod(int period) {
  if (weight_shards_ != nullptr) {
    const int next = (period + 1) % table_->cycle();
    const std::vector<int> none;
    const std::vector<int>& kept =
        next < table_->OptimizerPeriod() ? table_->period_chunks[static_cast<size_t>(next)] : none;
    for (Chunk& chunk : table_->chunks) {
      Payload& p = chunk.payload(PayloadKind::kParam);
      if (p.resident && p.host_sharded() && std::find(kept.begin(), kept.end(), chunk.id) == kept.end()) {
        mover_->Evict(p, table_->Preserve(p));
      }
    }
    // Whatever the policy: what the next period gathers must not depend on
    // it (Prepare).
    return;
  }
  // Warm-up keeps only what the current period needs, so that the trace
  // measures non-model memory with room to spare; static streams the chunks
  // it does not pin. Auto keeps everything until room is short.
  if (adaptive()) return;
  for (int c : table_->period_chunks[static_cast<size_t>(period)]) {
    Payload& p = table_->payload(c, PayloadKind::kParam);
    if (!p.pinned) mover_->Evict(p, table_->Preserve(p));
  }
}

PlanInput PlacementPolicy::MakePlanInput() const {
  PlanInput in;
  const double margin = options_.policy == MemoryOptions::Policy::kAuto ? options_.margin : 0.0;
  in.limit_bytes = static_cast<uint64_t>(double(device_->capacity_bytes()) * (1.0 - margin));
  in.non_model_bytes = tracer_->warmup_trace();
  in.period_chunks = table_->period_chunks;
  in.forward_periods = table_->stage_count();
  in.backward_periods = table_->stage_count();
  in.accumulates = accumulates_;
  for (const Chunk& chunk : table_->chunks) {
    in.param_bytes.push_back(chunk.payload(PayloadKind::kParam).bytes);
    in.grad_bytes.push_back(chunk.payload(PayloadKind::kGrad).bytes);
    in.optimizer_bytes.push_back(chunk.payload(PayloadKind::kOptimizer).bytes);
    // A device-side update with LibTorch ops allocates the denominator
    // (fp32) and, in mixed precision, fp32 gradients; the simulated device
    // runs the CPU kernel in place (unless told to run the GPU's).
    const uint64_t fp32 = static_cast<uint64_t>(chunk.capacity) * 4;
    in.update_temp_bytes.push_back(!device_update_temps_ ? 0 : mixed_ ? 2 * fp32 : fp32);
  }
  return in;
}

Plan PlacementPolicy::PlanFor(const PlanInput& in) const {
  return options_.policy == MemoryOptions::Policy::kStatic
             ? PlanStatic(in, options_.static_param_host_fraction, options_.static_optimizer_host_fraction)
             : PlanAuto(in);
}

absl::Status PlacementPolicy::PlanAfterWarmup() {
  PlanInput in = MakePlanInput();
  tracer_->ChooseRecompute([&](const std::vector<uint64_t>& trace) {
    PlanInput at = in;
    at.non_model_bytes = trace;
    return PlanFor(at).feasible;
  });
  in.non_model_bytes = tracer_->predicted();
  plan_ = PlanFor(in);
  // Static keeps to its split even where the trace says it will not fit: it
  // then fails with the device's own out-of-memory error.
  if (plan_.feasible || options_.policy == MemoryOptions::Policy::kStatic) return absl::OkStatus();
  const int p = plan_.binding_period;
  const uint64_t need = plan_.binding_need();
  const uint64_t activations = in.non_model_bytes[static_cast<size_t>(p)];
  const size_t largest = static_cast<size_t>(
      std::max_element(in.non_model_bytes.begin(), in.non_model_bytes.end()) - in.non_model_bytes.begin());
  const std::vector<bool>& recompute = tracer_->recompute();
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory: the step does not fit the device even with every chunk streamed: period '",
      table_->PeriodName(p, recompute), "' needs ", Mib(need), " (", Mib(activations),
      " of activations and workspace, ", Mib(need - activations),
      " of its chunks' parameters and gradients) but the device has ", Mib(in.limit_bytes), " (",
      Mib(device_->capacity_bytes()), " less a ", options_.margin * 100, "% margin); the largest non-model period is '",
      table_->PeriodName(static_cast<int>(largest), recompute), "' with ", Mib(in.non_model_bytes[largest]),
      ". Use a smaller train.batch_size or model.seq_len, ",
      options_.recompute == MemoryOptions::Recompute::kAll || options_.recompute == MemoryOptions::Recompute::kAuto
          ? ""
          : "recompute activations (memory.recompute: auto), ",
      "or raise memory.device_budget"));
}

void PlacementPolicy::Apply() {
  const int optimizer = table_->OptimizerPeriod();
  for (size_t c = 0; c < table_->chunks.size(); ++c) {
    Chunk& chunk = table_->chunks[c];
    // Fully sharded, every chunk's weights are gathered for the periods that
    // use them and released after: none stays on the device.
    if (weight_shards_ != nullptr) plan_.classes[c] = ChunkClass::kStreamed;
    chunk.chunk_class = plan_.classes[c];
    const bool homed = chunk.device_homed();
    std::vector<int> stage_periods;
    for (int s = 0; s < table_->stage_count(); ++s) {
      const auto& used = table_->stage_chunks[static_cast<size_t>(s)];
      if (std::find(used.begin(), used.end(), static_cast<int>(c)) != used.end()) {
        stage_periods.push_back(table_->ForwardPeriod(s));
        stage_periods.push_back(table_->BackwardPeriod(s));
      }
    }
    std::sort(stage_periods.begin(), stage_periods.end());
    Payload& p = chunk.payload(PayloadKind::kParam);
    Payload& g = chunk.payload(PayloadKind::kGrad);
    Payload& o = chunk.payload(PayloadKind::kOptimizer);
    p.uses = stage_periods;
    g.uses.clear();
    for (int period : stage_periods) {
      if (table_->IsBackward(period)) g.uses.push_back(period);
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
  applied_ = true;
}

void PlacementPolicy::ForgetPeriod() {
  // Nothing gathered is current: not even what was gathered ahead.
  FinishGathers();
  gathered_ahead_.clear();
  gathering_for_ = -1;
  last_period_ = -1;
}

void PlacementPolicy::BeginStep(bool new_shape, bool accumulates) {
  FinishGathers();  // (none runs past a step's last period: StartGathers)
  accumulates_ = accumulates;
  if (new_shape) {
    // Back to the warm-up's placement: every chunk's optimizer on the host.
    for (Chunk& chunk : table_->chunks) {
      for (Payload& p : chunk.payloads) {
        p.pinned = false;
        mover_->Evict(p, table_->Preserve(p));
      }
    }
    plan_.classes.assign(table_->chunks.size(), ChunkClass::kStreamed);
    Apply();
    applied_ = false;
  } else if (!applied_) {
    Apply();
  }
}

}  // namespace ferry
