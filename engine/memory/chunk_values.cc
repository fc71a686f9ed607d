#include "engine/memory/chunk_values.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
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

absl::Status ChunkValues::Fill(const std::vector<ManagedParam>& params, bool values_from_checkpoint,
                               uint64_t init_scratch_bytes,
                               const std::function<bool(int filled, int chunks)>& on_filled) {
  const int chunks = static_cast<int>(table_->chunks.size());
  for (Chunk& chunk : table_->chunks) {
    if (values_from_checkpoint) {
      TakeOver(chunk, params);
      continue;
    }
    if (on_filled && chunk.id > 0 && !on_filled(chunk.id, chunks)) {
      store_->FinishWrites();
      return absl::CancelledError(
          absl::StrCat("stopped while the model was built (", chunk.id, " of ", chunks, " chunks filled)"));
    }
    Payload& p = chunk.payload(PayloadKind::kParam);
    Payload& o = chunk.payload(PayloadKind::kOptimizer);
    store_->EnsureHost(p);
    HostAllocationScope host;
    // fp32: the parameter chunk is the master. Mixed precision: the master
    // sits with the optimizer states (drawn into a chunk of fp32 first where
    // those are on disk), the parameters are its rounded copy.
    at::Tensor master = p.host;
    // Drawn whole into a chunk of its own where the states keep a part of
    // it (a shard, or slices on disk), or the weights' host copy does.
    const bool drawn_apart = (mixed() && (o.home == Tier::kDisk || chunk.sharded())) || p.host_sharded();
    const uint64_t drawn_bytes = static_cast<uint64_t>(chunk.capacity) * sizeof(float);
    if (drawn_apart) {
      store_->ReserveHostBytes(drawn_bytes, absl::StrCat("chunk ", chunk.id, "'s master weights as they are drawn"));
      master = at::empty({chunk.capacity}, at::kFloat);
    } else if (mixed()) {
      store_->EnsureHost(o);
      o.host.zero_();
      master = o.host.narrow(0, 2 * chunk.shard_numel, chunk.shard_numel);
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
    if (drawn_apart) p.host.copy_(p.HostPart(master));
    if (mixed()) {
      if (!drawn_apart) p.host.copy_(master);
      chunk.optimizer_initialized = true;
      if (drawn_apart && o.home == Tier::kDisk) {
        // Moments zero, masters (this rank's shard of them) as drawn,
        // written behind.
        store_->StreamOut(o, [&](int64_t begin, int64_t count, const std::vector<at::Tensor>& views) {
          views[0].zero_();
          views[1].zero_();
          views[2].copy_(master.narrow(0, chunk.shard_begin + begin, count));
        });
        o.disk_valid = true;
      } else if (drawn_apart) {
        store_->EnsureHost(o);
        o.host.zero_();
        o.host.narrow(0, 2 * chunk.shard_numel, chunk.shard_numel)
            .copy_(master.narrow(0, chunk.shard_begin, chunk.shard_numel));
        o.host_valid = true;
      } else {
        o.host_valid = true;
      }
    }
    if (drawn_apart) {
      master = at::Tensor();
      store_->AddHostBytes(-static_cast<int64_t>(drawn_bytes));
    }
    p.host_valid = true;
    TakeOver(chunk, params);
  }
  store_->FinishWrites();
  store_->AddHostBytes(-static_cast<int64_t>(init_scratch_bytes));
  if (on_filled && !values_from_checkpoint) on_filled(chunks, chunks);
  return absl::OkStatus();
}

uint64_t ChunkValues::StateBytes() const {
  uint64_t size = sizeof kStateMagic + 2 * sizeof(int64_t);
  for (const Chunk& chunk : table_->chunks) {
    size += 2 * sizeof(int64_t);
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      if (kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) continue;
      size += sizeof(int64_t) + chunk.payload(kind).host_bytes();
    }
  }
  return size;
}

absl::Status ChunkValues::Save(const StateSink& sink) const {
  HostAllocationScope host;
  device_->SynchronizeTransfers();
  // One payload at a time, from wherever its current copy is: a host copy
  // is written in place, a device one through a host copy of that payload,
  // a disk one a region and a slice at a time through the staging. Fully
  // sharded, a rank's weights are its shard of them, as its host holds them.
  RETURN_IF_ERROR(sink(kStateMagic, sizeof kStateMagic));
  RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(table_->chunks.size())));
  RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(param_dtype_)));
  for (const Chunk& chunk : table_->chunks) {
    RETURN_IF_ERROR(PutInt(sink, chunk.capacity));
    RETURN_IF_ERROR(PutInt(sink, chunk.optimizer_initialized ? 1 : 0));
    for (PayloadKind kind : {PayloadKind::kParam, PayloadKind::kOptimizer}) {
      const Payload& p = chunk.payload(kind);
      if (kind == PayloadKind::kOptimizer && !chunk.optimizer_initialized) continue;
      const uint64_t bytes = p.host_bytes();
      RETURN_IF_ERROR(PutInt(sink, static_cast<int64_t>(bytes)));
      if (p.host_valid) {
        RETURN_IF_ERROR(sink(p.host.data_ptr(), bytes));
      } else if (p.resident && p.device_valid) {
        const at::Tensor current = p.device.narrow(0, p.host_begin, p.host_numel()).to(at::kCPU).contiguous();
        RETURN_IF_ERROR(sink(current.data_ptr(), bytes));
      } else if (p.home == Tier::kDisk && p.disk_valid) {
        absl::Status written;
        for (int r = 0; r < p.regions; ++r) {
          store_->StreamIn(
              p,
              [&](int64_t, int64_t count, const std::vector<at::Tensor>& views) {
                if (written.ok()) written = sink(views[0].data_ptr(), static_cast<size_t>(count) * views[0].element_size());
              },
              r);
        }
        RETURN_IF_ERROR(written);
      } else {
        throw std::logic_error(absl::StrCat("chunk ", chunk.id, " ", PayloadKindName(kind), ": no current copy"));
      }
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
      if (bytes != static_cast<int64_t>(p.host_bytes()) || static_cast<uint64_t>(bytes) > left) {
        return mismatch(absl::StrCat("chunk ", chunk.id, " ", PayloadKindName(kind), " has another size"));
      }
      if (p.resident) store_->Release(p);
      if (p.home == Tier::kDisk) {
        // A region and a slice at a time through the staging.
        absl::Status read;
        for (int r = 0; r < p.regions; ++r) {
          store_->StreamOut(
              p,
              [&](int64_t, int64_t count, const std::vector<at::Tensor>& views) {
                if (read.ok()) read = take(views[0].data_ptr(), static_cast<size_t>(count) * views[0].element_size());
              },
              r);
        }
        store_->FinishWrites(&p);
        RETURN_IF_ERROR(read);
        p.host_valid = false;
        p.disk_valid = true;
      } else {
        store_->EnsureHost(p);
        RETURN_IF_ERROR(take(p.host.data_ptr(), static_cast<size_t>(bytes)));
        p.host_valid = true;
      }
    }
    chunk.optimizer_initialized = initialized != 0;
  }
  if (left != 0) return mismatch("trailing bytes in the chunk state");
  return absl::OkStatus();
}

std::vector<at::Tensor> ChunkValues::Masters() const {
  HostAllocationScope host;
  device_->SynchronizeTransfers();
  std::vector<at::Tensor> values(table_->tensors.size());
  for (const Chunk& chunk : table_->chunks) {
    // The master: the parameter chunk in fp32, after the moments otherwise.
    const Payload& m = chunk.payload(mixed() ? PayloadKind::kOptimizer : PayloadKind::kParam);
    const int region = mixed() ? 2 : 0;
    for (int i : chunk.tensors) {
      values[static_cast<size_t>(i)] = at::empty({table_->tensors[static_cast<size_t>(i)].numel}, at::kFloat);
    }
    // Copies what of the chunk's tensors lies in elements [begin, begin +
    // part's length) of the master.
    auto take = [&](int64_t begin, const at::Tensor& part) {
      for (int i : chunk.tensors) {
        const ManagedTensor& t = table_->tensors[static_cast<size_t>(i)];
        const int64_t lo = std::max(begin, t.offset), hi = std::min(begin + part.numel(), t.offset + t.numel);
        if (lo >= hi) continue;
        values[static_cast<size_t>(i)].narrow(0, lo - t.offset, hi - lo).copy_(part.narrow(0, lo - begin, hi - lo));
      }
    };
    // Sharded, the states hold this rank's part of the masters (as, fully
    // sharded, the weights' host copy does in fp32): the parts are gathered
    // from the data group into a whole chunk first.
    const bool gathered = chunk.sharded() && (mixed() || m.host_sharded());
    const int64_t length = gathered ? chunk.shard_numel : chunk.capacity;
    at::Tensor whole;
    std::function<void(int64_t, const at::Tensor&)> put = take;
    if (gathered) {
      whole = at::zeros({chunk.capacity}, at::kFloat);
      put = [&](int64_t begin, const at::Tensor& part) {
        whole.narrow(0, chunk.shard_begin + begin, part.numel()).copy_(part);
      };
    }
    if (m.host_valid) {
      put(0, m.host.narrow(0, region * length, length));
    } else if (m.resident && m.device_valid) {
      // Fully sharded in fp32, the device copy is the weights whole.
      const int64_t at = m.host_sharded() ? chunk.shard_begin : region * length;
      put(0, m.device.narrow(0, at, length).to(at::kCPU));
    } else if (m.home == Tier::kDisk && m.disk_valid) {
      store_->StreamIn(
          m, [&](int64_t begin, int64_t, const std::vector<at::Tensor>& views) { put(begin, views[0]); }, region);
    } else {
      throw std::logic_error(absl::StrCat("chunk ", chunk.id, ": no current master weights"));
    }
    if (gathered) {
      chunk.GatherShards(data_, whole);
      take(0, whole);
    }
  }
  for (size_t i = 0; i < values.size(); ++i) values[i] = values[i].view(table_->tensors[i].param.sizes());
  return values;
}

}  // namespace ferry
