#include "engine/train/hf_export.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/model/gpt.h"
#include "engine/model/hf_layout.h"
#include "engine/train/restore.h"

namespace ferry {
namespace {

// The whole tensor from every tensor rank's part (TensorParallelJoin); a
// tensor every rank holds whole must be the same on each.
absl::StatusOr<at::Tensor> Join(const ModelConfig& model, const std::string& name,
                                const std::vector<at::Tensor>& parts) {
  if (parts.size() == 1) return parts[0];
  if (!IsTensorParallelShard(model, name)) {
    for (size_t r = 1; r < parts.size(); ++r) {
      if (!at::equal(parts[r], parts[0])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint: tensor ranks 0 and ", r, " hold different values of ", name,
            ", which every rank holds whole; the checkpoints are not of one step of one job"));
      }
    }
    return parts[0];
  }
  return TensorParallelJoin(model, name, parts);
}

}  // namespace

absl::Status ExportHfWeights(const ModelConfig& model, const TrainOptions& train, const MemoryOptions& memory,
                             const std::vector<const CheckpointContents*>& world_ranks, MemoryDevice* device,
                             int data_ranks, const HfTensorSink& sink) {
  if (world_ranks.empty() || data_ranks < 1 || world_ranks.size() % static_cast<size_t>(data_ranks) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("no checkpoint to export of each of ", data_ranks, " data ranks"));
  }
  const int ranks = static_cast<int>(world_ranks.size()) / data_ranks;  // tensor ranks
  std::vector<NamedTensors> restored;
  for (int t = 0; t < ranks; ++t) {
    std::vector<const CheckpointContents*> of_rank;
    for (int d = 0; d < data_ranks; ++d) of_rank.push_back(world_ranks[static_cast<size_t>(d * ranks + t)]);
    ASSIGN_OR_RETURN(NamedTensors named, RestoreParameters(model, train, memory, of_rank, device, t, ranks));
    restored.push_back(std::move(named));
  }
  // Each parameter's tensors in the family's layout (hf_layout.h): a fused
  // layer's rows split back into its projections.
  std::map<std::string, std::vector<HfTensor>> of_param;
  for (HfTensor& t : HfTensors(model)) of_param[t.param].push_back(std::move(t));
  return CallTorch("exporting weights", [&]() -> absl::Status {
    for (size_t i = 0; i < restored[0].size(); ++i) {
      const std::string name = restored[0][i].first;
      std::vector<at::Tensor> parts;
      for (auto& rank : restored) parts.push_back(std::move(rank.at(i).second));
      ASSIGN_OR_RETURN(at::Tensor whole, Join(model, name, parts));
      parts.clear();  // the parameter's values go as its tensors are written
      const auto tensors = of_param.find(name);
      if (tensors == of_param.end()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", name, " is not a parameter of this model"));
      }
      for (const HfTensor& hf : tensors->second) {
        const int64_t rows = hf.transposed ? hf.shape[1] : hf.shape[0];
        at::Tensor value = whole.narrow(0, hf.row_offset, rows);
        if (hf.transposed) value = value.t();
        value = value.to(at::kCPU, at::kFloat).contiguous();
        RETURN_IF_ERROR(sink(hf.name, value.data_ptr(), static_cast<uint64_t>(value.nbytes())));
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<SafetensorsTensor>> ExportHfWeights(
    const ModelConfig& model, const TrainOptions& train, const MemoryOptions& memory,
    const std::vector<const CheckpointContents*>& world_ranks, MemoryDevice* device, int data_ranks) {
  std::map<std::string, std::string> made;
  RETURN_IF_ERROR(ExportHfWeights(model, train, memory, world_ranks, device, data_ranks,
                                  [&](const std::string& name, const void* data, uint64_t bytes) {
                                    made[name].assign(static_cast<const char*>(data), bytes);
                                    return absl::OkStatus();
                                  }));
  std::vector<SafetensorsTensor> out;
  for (const SafetensorsEntry& e : HfExportEntries(model)) {
    auto it = made.find(e.name);
    if (it == made.end()) return absl::InternalError(absl::StrCat("export: ", e.name, " was not made"));
    out.push_back({e.name, e.dtype, e.shape, std::move(it->second)});
  }
  return out;
}

std::vector<SafetensorsEntry> HfExportEntries(const ModelConfig& model) {
  std::vector<SafetensorsEntry> entries;
  for (const HfTensor& t : HfTensors(model)) entries.push_back({t.name, "F32", t.shape});
  return entries;
}

}  // namespace ferry
