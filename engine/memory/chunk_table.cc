#include "engine/memory/chunk_table.h"

#include <set>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace ferry {

void Chunk::GatherShards(Communicator* data, const at::Tensor& whole) const {
  StartGatherShards(data, whole)->Wait();
}

std::unique_ptr<PendingCollective> Chunk::StartGatherShards(Communicator* data, const at::Tensor& whole) const {
  if (data == nullptr || data->size() * shard_numel != capacity) {
    throw std::logic_error(absl::StrCat("chunk ", id, " is sharded but the data group cannot gather it"));
  }
  return data->StartAllGatherInto(whole.narrow(0, shard_begin, shard_numel), whole.narrow(0, 0, capacity));
}

std::string ChunkTable::PeriodName(int period, const std::vector<bool>& recompute) const {
  if (period < 0) return "set-up";
  if (period == OptimizerPeriod()) return "optimizer";
  if (period < stage_count()) return "forward " + stages[static_cast<size_t>(period)].name;
  const size_t stage = static_cast<size_t>(2 * stage_count() - 1 - period);
  // A recomputing stage's backward period includes re-running its forward.
  return (recompute.size() > stage && recompute[stage] ? "recompute+backward " : "backward ") + stages[stage].name;
}

uint64_t ChunkTable::DeviceModelBytes() const {
  uint64_t bytes = 0;
  for (const Chunk& c : chunks) {
    for (const Payload& p : c.payloads) {
      if (p.resident) bytes += p.bytes;
    }
  }
  return bytes;
}

bool ChunkTable::Preserve(const Payload& p) const {
  const Chunk& c = chunk(p.chunk);
  switch (p.kind) {
    case PayloadKind::kParam:
      return true;
    case PayloadKind::kGrad:
      return c.grad_started && (!c.grad_reduced || c.device_homed());
    case PayloadKind::kOptimizer:
      return c.optimizer_initialized;
  }
  return true;
}

absl::Status ChunkTable::IndexStages() {
  stage_chunks.assign(stages.size(), {});
  for (size_t s = 0; s < stages.size(); ++s) {
    std::set<int> used;
    for (int i : stages[s].params) {
      if (i < 0 || i >= static_cast<int>(tensors.size())) {
        return absl::InvalidArgumentError(absl::StrCat("stage ", stages[s].name, " names parameter ", i));
      }
      used.insert(tensors[static_cast<size_t>(i)].chunk);
      ++tensors[static_cast<size_t>(i)].backward_uses;
    }
    stage_chunks[s].assign(used.begin(), used.end());
  }
  period_chunks.assign(static_cast<size_t>(cycle()), {});
  for (int s = 0; s < stage_count(); ++s) {
    period_chunks[static_cast<size_t>(ForwardPeriod(s))] = stage_chunks[static_cast<size_t>(s)];
    period_chunks[static_cast<size_t>(BackwardPeriod(s))] = stage_chunks[static_cast<size_t>(s)];
  }
  return absl::OkStatus();
}

}  // namespace ferry
