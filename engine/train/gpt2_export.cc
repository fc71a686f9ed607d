#include "engine/train/gpt2_export.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/model/gpt.h"
#include "engine/model/hf_layout.h"
#include "engine/train/trainer.h"

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

absl::StatusOr<std::vector<SafetensorsTensor>> ExportHfWeights(
    const ModelConfig& model, const TrainOptions& train, const MemoryOptions& memory,
    const std::vector<const CheckpointContents*>& world_ranks, MemoryDevice* device, int data_ranks) {
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
  std::vector<SafetensorsTensor> out;
  RETURN_IF_ERROR(CallTorch("exporting weights", [&]() -> absl::Status {
    for (size_t i = 0; i < restored[0].size(); ++i) {
      const std::string& name = restored[0][i].first;
      std::vector<at::Tensor> parts;
      for (const auto& rank : restored) parts.push_back(rank.at(i).second);
      ASSIGN_OR_RETURN(at::Tensor whole, Join(model, name, parts));
      const auto tensors = of_param.find(name);
      if (tensors == of_param.end()) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", name, " is not a parameter of this model"));
      }
      for (const HfTensor& hf : tensors->second) {
        const int64_t rows = hf.transposed ? hf.shape[1] : hf.shape[0];
        at::Tensor value = whole.narrow(0, hf.row_offset, rows);
        if (hf.transposed) value = value.t();
        value = value.to(at::kCPU, at::kFloat).contiguous();
        SafetensorsTensor t;
        t.name = hf.name;
        t.dtype = "F32";
        t.shape = value.sizes().vec();
        t.data.assign(static_cast<const char*>(value.data_ptr()), static_cast<size_t>(value.nbytes()));
        out.push_back(std::move(t));
      }
    }
    return absl::OkStatus();
  }));
  return out;
}

std::map<std::string, std::string> Gpt2ConfigMetadata(const ModelConfig& model) {
  return {{"model_type", "gpt2"},
          {"n_layer", absl::StrCat(model.layers)},
          {"n_embd", absl::StrCat(model.hidden)},
          {"n_head", absl::StrCat(model.heads)},
          {"n_positions", absl::StrCat(model.seq_len)},
          {"n_ctx", absl::StrCat(model.seq_len)},
          {"vocab_size", absl::StrCat(model.vocab_size)},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", "1e-05"},
          {"tie_word_embeddings", "true"}};
}

}  // namespace ferry
