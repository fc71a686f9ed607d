#include "engine/train/restore.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/parallel/communicator.h"
#include "engine/train/step_engine.h"

namespace ferry {
namespace {

// RestoreParameters' arguments, checked once for both forms.
absl::Status CheckRestoring(const MemoryDevice* device, int tensor_rank, int tensor_ranks) {
  if (device == nullptr) return absl::InvalidArgumentError("RestoreParameters: no device");
  if (tensor_ranks < 1 || tensor_rank < 0 || tensor_rank >= tensor_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor rank ", tensor_rank, " of ", tensor_ranks));
  }
  return absl::OkStatus();
}

// The vocabulary's pieces (VocabPieces) joined into the tensors they are
// rows of, in the first one's place.
NamedTensors JoinVocabPieces(NamedTensors named) {
  NamedTensors joined;
  for (size_t i = 0; i < named.size();) {
    std::string base, next;
    int k = 0;
    if (!ParseVocabPiece(named[i].first, &base, &k)) {
      joined.push_back(std::move(named[i++]));
      continue;
    }
    std::vector<at::Tensor> rows;
    while (i < named.size() && ParseVocabPiece(named[i].first, &next, &k) && next == base) {
      rows.push_back(std::move(named[i++].second));
    }
    joined.emplace_back(base, at::cat(rows, 0));
  }
  return joined;
}

// One rank's parameters from its checkpoint; `data`, when set, is the group
// its chunks are sharded over (every rank of it restores its own checkpoint
// beside, and the masters' shards are gathered).
absl::StatusOr<NamedTensors> RestoreRank(const ModelConfig& model, const TrainOptions& options,
                                         const MemoryOptions& memory, const CheckpointContents& checkpoint,
                                         MemoryDevice* device, int tensor_rank, int tensor_ranks, int world_rank,
                                         Communicator* data) {
  NamedTensors named;
  RETURN_IF_ERROR(CallTorch("restoring a checkpoint's parameters", [&]() -> absl::Status {
    PlaceOnlyCommunicator tensor(tensor_rank, tensor_ranks);
    SilentObserver observer;
    // Built as training builds it, so that its parameters pack into the
    // same chunks; their values come from the checkpoint alone.
    CpuGeneratorScope generator(at::make_generator<at::CPUGeneratorImpl>(options.seed));
    Gpt gpt(nullptr);
    {
      HostAllocationScope host;
      gpt = Gpt(model, &tensor, GptImpl::ParameterInit::kDeferred);
    }
    MemoryOptions restoring = memory;
    restoring.values_from_checkpoint = true;
    absl::StatusOr<std::unique_ptr<ChunkedEngine>> engine =
        ChunkedEngine::Create(std::move(gpt), options, restoring, device, {&tensor, data}, &observer);
    absl::Status restored = engine.status();
    if (restored.ok()) restored = (*engine)->RestoreState(absl::StrCat("rank", world_rank, "."), checkpoint);
    if (data != nullptr) {
      // The gather below needs every rank: all go on, or none does.
      at::Tensor failed = at::full({1}, restored.ok() ? 0.0f : 1.0f);
      data->AllReduce(failed);
      if (restored.ok() && failed.item<float>() > 0) {
        restored = absl::FailedPreconditionError("another data rank's checkpoint could not be restored");
      }
    }
    RETURN_IF_ERROR(restored);
    named = JoinVocabPieces((*engine)->NamedParameterValues());
    return absl::OkStatus();
  }));
  return named;
}

}  // namespace

absl::StatusOr<NamedTensors> RestoreParameters(const ModelConfig& model, const TrainOptions& options,
                                               const MemoryOptions& memory, const CheckpointContents& checkpoint,
                                               MemoryDevice* device, int tensor_rank, int tensor_ranks,
                                               int world_rank) {
  RETURN_IF_ERROR(CheckRestoring(device, tensor_rank, tensor_ranks));
  return RestoreRank(model, options, memory, checkpoint, device, tensor_rank, tensor_ranks, world_rank, nullptr);
}

absl::StatusOr<NamedTensors> RestoreParameters(const ModelConfig& model, const TrainOptions& options,
                                               const MemoryOptions& memory,
                                               const std::vector<const CheckpointContents*>& data_ranks,
                                               MemoryDevice* device, int tensor_rank, int tensor_ranks) {
  const int size = static_cast<int>(data_ranks.size());
  if (size < 1 || std::count(data_ranks.begin(), data_ranks.end(), nullptr) > 0) {
    return absl::InvalidArgumentError("RestoreParameters: a data rank's checkpoint is missing");
  }
  RETURN_IF_ERROR(CheckRestoring(device, tensor_rank, tensor_ranks));
  if (memory.shard == MemoryOptions::Shard::kNone || size == 1) {
    return RestoreRank(model, options, memory, *data_ranks[0], device, tensor_rank, tensor_ranks, tensor_rank, nullptr);
  }
  // Each data rank's checkpoint restored as that rank, the ranks threads of
  // this process meeting over Gloo, as training's do across processes.
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  std::vector<absl::StatusOr<NamedTensors>> restored(static_cast<size_t>(size), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int d = 0; d < size; ++d) {
    threads.emplace_back([&, d] {
      CommunicatorOptions comm;
      comm.name = "restore";
      comm.timeout = std::chrono::minutes(30);  // the slowest rank's restore
      absl::StatusOr<std::unique_ptr<Communicator>> data = CreateGlooCommunicator(store, d, size, comm);
      if (!data.ok()) {
        restored[static_cast<size_t>(d)] = data.status();
        return;
      }
      restored[static_cast<size_t>(d)] =
          RestoreRank(model, options, memory, *data_ranks[static_cast<size_t>(d)], device, tensor_rank, tensor_ranks,
                      d * tensor_ranks + tensor_rank, data->get());
      // Every rank done with the group before any tears it down.
      try {
        (*data)->Barrier();
      } catch (const CollectiveException&) {
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::StatusOr<NamedTensors>& r : restored) {
    if (!r.ok() && !absl::IsFailedPrecondition(r.status())) return r.status();
  }
  return std::move(restored[0]);
}

}  // namespace ferry
