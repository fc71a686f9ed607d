#include "engine/memory/chunk_values.h"

#include <ATen/ATen.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/memory/simulated_device.h"

namespace ferry {
namespace {

constexpr char kStateMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'K', '1'};

absl::Status PutInt(const ChunkValues::StateSink& sink, int64_t v) { return sink(&v, sizeof v); }

}  // namespace

void ChunkValues::TakeOver(const Chunk& chunk, const std::vector<ManagedParam>& params) {
  for (int i : chunk.tensors) {
    ManagedTensor& t = table_->tensors[static_cast<size_t>(i)];
    const std::vector<int64_t> shape = t.param.sizes().vec();
    if (!params[static_cast<size_t>(i)].init) {
      store_->AddHostBytes(-static_cast<int64_t>(t.param.numel() * t.param.element_size()));
    }
    t.param.set_data(chunk.payload(PayloadKind::kParam).device.narrow(0, t.offset, t.numel).view(shape));
    t.param.mutable_grad() = chunk.payload(PayloadKind::kGrad).device.narrow(0, t.offset, t.numel).view(shape);
    t.state = Transition(t.name, t.state, TensorState::kHold);
  }
}

void ChunkValues::Fill(const std::vector<ManagedParam>& params, bool values_from_checkpoint,
                       uint64_t init_scratch_bytes) {
  // Disk-homed masters are written behind, through the staging buffers in
  // turn.
  std::vector<std::pair<Payload*, DiskStore::Ticket>> writing(store_->staging_count(), {nullptr, 0});
  int next_buffer = 0;
  for (Chunk& chunk : table_->chunks) {
    if (values_from_checkpoint) {
      TakeOver(chunk, params);
      continue;
    }
    Payload& p = chunk.payload(PayloadKind::kParam);
    Payload& o = chunk.payload(PayloadKind::kOptimizer);
    store_->EnsureHost(p);
    HostAllocationScope host;
    // fp32: the parameter chunk is the master. Mixed precision: the master
    // sits with the optimizer states, the parameters are its rounded copy.
    at::Tensor master = p.host;
    if (mixed()) {
      if (o.home == Tier::kDisk) {
        auto& [previous, ticket] = writing[static_cast<size_t>(next_buffer)];
        if (previous != nullptr) store_->FinishStore(*previous, ticket);
        store_->AttachStaging(o, next_buffer);
        next_buffer = (next_buffer + 1) % static_cast<int>(store_->staging_count());
      } else {
        store_->EnsureHost(o);
      }
      o.host.zero_();
      chunk.optimizer_initialized = true;
      master = o.host.narrow(0, 2 * chunk.capacity, chunk.capacity);
    }
    master.zero_();
    for (int i : chunk.tensors) {
      const ManagedTensor& t = table_->tensors[static_cast<size_t>(i)];
      const ManagedParam& param = params[static_cast<size_t>(i)];
      if (param.init) {
        param.init(master.narrow(0, t.offset, t.numel));
      } else {
        master.narrow(0, t.offset, t.numel).copy_(t.param.detach().reshape({-1}));
      }
    }
    if (mixed()) {
      p.host.copy_(master);
      o.host_valid = true;
      if (o.home == Tier::kDisk) writing[static_cast<size_t>(o.staging)] = {&o, store_->StartStore(o)};
    }
    p.host_valid = true;
    TakeOver(chunk, params);
  }
  for (auto& [o, ticket] : writing) {
    if (o != nullptr) store_->FinishStore(*o, ticket);
  }
  store_->AddHostBytes(-static_cast<int64_t>(init_scratch_bytes));
}

uint64_t ChunkValues::StateBytes() const {
  uint64_t size = sizeof kStateMagic + 2 * sizeof(int64_t);
  for (const Chunk& chunk : table_->chunks) {
    size += 2 * sizeof(int64_t);
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      if (kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) continue;
      size += sizeof(int64_t) + chunk.payload(kind).bytes;
    }
  }
  return size;
}

absl::Status ChunkValues::Save(const StateSink& sink) const {
  HostAllocationScope host;
  device_->SynchronizeTransfers();
  // One payload at a time, from wherever its current copy is: a host copy
  // is written in place, a device one through a host copy of that payload,
  // a disk one through a staging buffer.
  RETURN_IF_ERROR(sink(kStateMagic, sizeof kStateMagic));
  RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(table_->chunks.size())));
  RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(param_dtype_)));
  for (const Chunk& chunk : table_->chunks) {
    RETURN_IF_ERROR(PutInt(sink, chunk.capacity));
    RETURN_IF_ERROR(PutInt(sink, chunk.optimizer_initialized ? 1 : 0));
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      const Payload& p = chunk.payload(kind);
      if (kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) continue;
      RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(p.bytes)));
      absl::Status written;
      store_->WithCurrentCopy(p, [&](const at::Tensor& copy) {
        const at::Tensor current = copy.to(at::kCPU).contiguous();
        written = sink(current.data_ptr(), p.bytes);
      });
      RETURN_IF_ERROR(written);
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkValues::Restore(uint64_t size, const StateSource& source) {
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
  if (count != static_cast<int64_t>(table_->chunks.size())) {
    return mismatch(absl::StrCat(count, " chunks, this run has ", table_->chunks.size()));
  }
  if (dtype != static_cast<int64_t>(param_dtype_)) return mismatch("parameters of another type");
  HostAllocationScope host;
  for (Chunk& chunk : table_->chunks) {
    int64_t capacity = 0, initialized = 0;
    RETURN_IF_ERROR(take_int(&capacity));
    RETURN_IF_ERROR(take_int(&initialized));
    if (capacity != chunk.capacity) {
      return mismatch(absl::StrCat("chunk ", chunk.id, " holds ", capacity, " elements, here ", chunk.capacity));
    }
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      Payload& p = chunk.payload(kind);
      if (kind == PayloadKind::kOptimizer && initialized == 0) {
        if (p.resident) store_->Release(p);
        p.host_valid = false;
        p.disk_valid = false;
        continue;
      }
      int64_t bytes = 0;
      RETURN_IF_ERROR(take_int(&bytes));
      if (bytes != static_cast<int64_t>(p.bytes) || static_cast<uint64_t>(bytes) > left) {
        return mismatch(absl::StrCat("chunk ", chunk.id, " ", PayloadKindName(kind), " has another size"));
      }
      if (p.resident) store_->Release(p);
      store_->HostBuffer(p);
      RETURN_IF_ERROR(take(p.host.data_ptr(), static_cast<size_t>(bytes)));
      p.host_valid = true;
      store_->WriteHome(p);
    }
    chunk.optimizer_initialized = initialized != 0;
  }
  if (left != 0) return mismatch("trailing bytes in the chunk state");
  return absl::OkStatus();
}

std::vector<at::Tensor> ChunkValues::Masters() const {
  HostAllocationScope host;
  device_->SynchronizeTransfers();
  std::vector<at::Tensor> values;
  for (const ManagedTensor& t : table_->tensors) {
    const Chunk& chunk = table_->chunk(t.chunk);
    // The master: the parameter chunk in fp32, after the moments otherwise.
    const Payload& m = chunk.payload(mixed() ? PayloadKind::kOptimizer : PayloadKind::kParam);
    const int64_t base = mixed() ? 2 * chunk.capacity : 0;
    store_->WithCurrentCopy(m, [&](const at::Tensor& current) {
      values.push_back(current.narrow(0, base + t.offset, t.numel)
                           .to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                           .view(t.param.sizes()));
    });
  }
  return values;
}

}  // namespace ferry
