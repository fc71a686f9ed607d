#include "engine/train/gpt2_export.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/model/gpt.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

// The whole tensor from every tensor rank's part, undoing GptImpl's split
// (TensorParallelPart): c_attn's rows are [q; k; v], each split by heads;
// the row-parallel c_proj weights are split by columns; c_fc and the
// vocabulary (wte) by rows; the rest is whole on every rank.
absl::StatusOr<at::Tensor> Join(const std::string& name, const std::vector<at::Tensor>& parts) {
  if (parts.size() == 1) return parts[0];
  if (!IsTensorParallelShard(name)) {
    for (size_t r = 1; r < parts.size(); ++r) {
      if (!at::equal(parts[r], parts[0])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint: tensor ranks 0 and ", r, " hold different values of ", name,
            ", which every rank holds whole; the checkpoints are not of one step of one job"));
      }
    }
    return parts[0];
  }
  if (absl::StrContains(name, ".c_attn.")) {
    std::vector<at::Tensor> qkv;
    int64_t rows = 0;
    for (const at::Tensor& p : parts) {
      qkv.push_back(p.reshape({3, p.size(0) / 3, -1}));
      rows += p.size(0);
    }
    at::Tensor whole = at::cat(qkv, 1);
    return parts[0].dim() == 1 ? whole.reshape({rows}) : whole.reshape({rows, parts[0].size(1)});
  }
  return at::cat(parts, absl::EndsWith(name, "c_proj.weight") ? 1 : 0);
}

// GPT-2's Conv1D layers keep their weights as [in, out].
bool IsConv1DWeight(const std::string& name) {
  return absl::EndsWith(name, ".weight") &&
         (absl::StrContains(name, ".c_attn.") || absl::StrContains(name, ".c_proj.") ||
          absl::StrContains(name, ".c_fc."));
}

}  // namespace

absl::StatusOr<std::vector<SafetensorsTensor>> ExportGpt2Weights(
    const GptConfig& model, const TrainOptions& train, const MemoryOptions& memory,
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
  std::vector<SafetensorsTensor> out;
  RETURN_IF_ERROR(CallTorch("exporting weights", [&]() -> absl::Status {
    for (size_t i = 0; i < restored[0].size(); ++i) {
      const std::string& name = restored[0][i].first;
      std::vector<at::Tensor> parts;
      for (const auto& rank : restored) parts.push_back(rank.at(i).second);
      ASSIGN_OR_RETURN(at::Tensor whole, Join(name, parts));
      if (IsConv1DWeight(name)) whole = whole.t();
      whole = whole.to(at::kCPU, at::kFloat).contiguous();
      SafetensorsTensor t;
      t.name = name;
      t.dtype = "F32";
      t.shape = whole.sizes().vec();
      t.data.assign(static_cast<const char*>(whole.data_ptr()), static_cast<size_t>(whole.nbytes()));
      out.push_back(std::move(t));
    }
    return absl::OkStatus();
  }));
  return out;
}

std::map<std::string, std::string> Gpt2ConfigMetadata(const GptConfig& model) {
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
