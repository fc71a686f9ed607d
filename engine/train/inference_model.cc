#include "engine/train/inference_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/train/hf_import.h"
#include "engine/train/step_engine.h"

namespace ferry {
namespace {

// The cache and its checks, for an inference model that computes the
// logits of new positions with or without one.
class CachingInferenceModel : public InferenceModel {
 public:
  explicit CachingInferenceModel(const ModelConfig& config) : config_(config) {}
  const ModelConfig& config() const override { return config_; }
  absl::StatusOr<at::Tensor> LastLogits(const at::Tensor& tokens) override { return Logits(tokens, nullptr); }
  absl::StatusOr<at::Tensor> AppendLogits(const at::Tensor& tokens) override {
    // New positions: one row, at least one token, within seq_len.
    if (tokens.dim() != 2 || tokens.size(0) != 1 || tokens.size(1) < 1) {
      return absl::InvalidArgumentError("cached generation takes one row of at least one token");
    }
    if (cache_.positions() + tokens.size(1) > config_.seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("cached generation: ", cache_.positions(),
                                                     " positions cached and ", tokens.size(1),
                                                     " more are beyond seq_len ", config_.seq_len,
                                                     "; reset the cache"));
    }
    absl::StatusOr<at::Tensor> logits = Logits(tokens, &cache_);
    // A forward that failed part way leaves some blocks' positions cached.
    if (!logits.ok()) cache_.Clear();
    return logits;
  }
  void ResetCache() override { cache_.Clear(); }
  int64_t cached_positions() const override { return cache_.positions(); }

 protected:
  // The last position's logits of `tokens`, after `cache`'s positions when
  // there is one, which then holds theirs too.
  virtual absl::StatusOr<at::Tensor> Logits(const at::Tensor& tokens, KvCache* cache) = 0;
  ModelConfig config_;

 private:
  KvCache cache_;
};

// Through the chunks: the memory manager places them on the device.
class ChunkedInferenceModel : public CachingInferenceModel {
 public:
  ChunkedInferenceModel(const ModelConfig& config, std::unique_ptr<ChunkedEngine> engine,
                        std::unique_ptr<SilentObserver> observer, std::unique_ptr<Communicator> data)
      : CachingInferenceModel(config),
        observer_(std::move(observer)),
        data_(std::move(data)),
        engine_(std::move(engine)) {}

 protected:
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& tokens, KvCache* cache) override {
    at::Tensor logits;
    RETURN_IF_ERROR(CallTorch("generating", [&]() -> absl::Status {
      try {
        logits = engine_->LastLogits(tokens, cache).to(at::kCPU);
      } catch (const c10::OutOfMemoryError& e) {
        return absl::ResourceExhaustedError(engine_->ExplainOutOfMemory(e.what_without_backtrace()));
      }
      return absl::OkStatus();
    }));
    return logits;
  }

 private:
  std::unique_ptr<SilentObserver> observer_;  // the engine's, outlives it
  std::unique_ptr<Communicator> data_;        // the engine's shape of its data group, outlives it
  std::unique_ptr<ChunkedEngine> engine_;
};

// The whole model on the device, in fp32.
class WholeInferenceModel : public CachingInferenceModel {
 public:
  WholeInferenceModel(const ModelConfig& config, Gpt model, MemoryDevice* device)
      : CachingInferenceModel(config), model_(std::move(model)), device_(device) {}

 protected:
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& tokens, KvCache* cache) override {
    at::Tensor logits;
    RETURN_IF_ERROR(CallTorch("generating", [&]() -> absl::Status {
      try {
        torch::NoGradGuard no_grad;
        GptImpl& gpt = *model_;
        const int64_t first = cache != nullptr ? cache->positions() : 0;
        if (cache != nullptr) cache->layers.resize(static_cast<size_t>(gpt.block_count()));
        torch::Tensor x = gpt.Embed(tokens.to(device_->compute_device()), first);
        for (int64_t i = 0; i < gpt.block_count(); ++i) {
          x = gpt.block(i).forward(x, cache != nullptr ? &cache->layers[static_cast<size_t>(i)] : nullptr);
        }
        logits = gpt.LastLogits(x).to(at::kCPU);
      } catch (const c10::OutOfMemoryError& e) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "out of device memory with the whole model on the device: ", e.what_without_backtrace()));
      }
      return absl::OkStatus();
    }));
    return logits;
  }

 private:
  Gpt model_;
  MemoryDevice* device_;
};

absl::Status CheckSingleRankConfig(const ModelConfig& model, MemoryDevice* device) {
  if (device == nullptr) return absl::InvalidArgumentError("no device");
  if (model.layers < 1 || model.hidden < 1 || model.heads < 1 || model.vocab_size < 1 || model.seq_len < 1) {
    return absl::InvalidArgumentError("the model's shape is empty");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<InferenceModel>> RestoreInferenceModel(const ModelConfig& model,
                                                                      const TrainOptions& options,
                                                                      const MemoryOptions& memory,
                                                                      const CheckpointContents& checkpoint,
                                                                      MemoryDevice* device, int data_ranks) {
  RETURN_IF_ERROR(CheckSingleRankConfig(model, device));
  if (data_ranks < 1) return absl::InvalidArgumentError(absl::StrCat("data ranks: ", data_ranks));
  if (data_ranks > 1 && memory.shard == MemoryOptions::Shard::kFull) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parallel.shard: full: each of the ", data_ranks, " data ranks' checkpoints holds 1/", data_ranks,
        " of the weights; export the run (ferry export joins them) and generate from the exported weights"));
  }
  std::unique_ptr<InferenceModel> out;
  RETURN_IF_ERROR(CallTorch("restoring a checkpoint for generation", [&]() -> absl::Status {
    auto observer = std::make_unique<SilentObserver>();
    // Built as training builds it, so that its parameters pack into the
    // same chunks; their values come from the checkpoint alone.
    CpuGeneratorScope generator(at::make_generator<at::CPUGeneratorImpl>(options.seed));
    Gpt gpt(nullptr);
    {
      HostAllocationScope host;
      gpt = Gpt(model, nullptr, GptImpl::ParameterInit::kDeferred);
    }
    MemoryOptions restoring = memory;
    restoring.values_from_checkpoint = true;
    // Sharded, data rank 0's chunks are laid out for its shard; its weights
    // are whole, which is all a forward reads.
    std::unique_ptr<Communicator> data;
    if (data_ranks > 1) data = std::make_unique<PlaceOnlyCommunicator>(0, data_ranks, "data");
    ASSIGN_OR_RETURN(std::unique_ptr<ChunkedEngine> engine,
                     ChunkedEngine::Create(std::move(gpt), options, restoring, device, {nullptr, data.get()},
                                           observer.get()));
    RETURN_IF_ERROR(engine->RestoreState("rank0.", checkpoint));
    out = std::make_unique<ChunkedInferenceModel>(model, std::move(engine), std::move(observer), std::move(data));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<std::unique_ptr<InferenceModel>> LoadInferenceModel(const std::string& path, const ModelConfig& model,
                                                                   const TrainOptions& options,
                                                                   const std::optional<MemoryOptions>& memory,
                                                                   MemoryDevice* device) {
  RETURN_IF_ERROR(CheckSingleRankConfig(model, device));
  std::unique_ptr<InferenceModel> out;
  RETURN_IF_ERROR(CallTorch(absl::StrCat("reading ", path), [&]() -> absl::Status {
    Gpt gpt(nullptr);
    {
      HostAllocationScope host;
      gpt = Gpt(model, nullptr, GptImpl::ParameterInit::kDeferred);
      if (!path.empty()) RETURN_IF_ERROR(InitFromWeights(path, model, *gpt));
      if (!memory.has_value()) gpt->Materialize();
    }
    if (!memory.has_value()) {
      if (options.precision != TrainOptions::Precision::kFp32) {
        return absl::InvalidArgumentError("reduced precision needs the memory manager's chunks");
      }
      gpt->eval();
      gpt->to(device->compute_device());
      // On the simulated device the model was built as host memory; give it
      // device memory so that it counts against the capacity.
      if (device->compute_device().is_cpu()) {
        for (torch::Tensor& p : gpt->parameters()) p.set_data(p.detach().clone());
        for (torch::Tensor& b : gpt->buffers()) b.set_data(b.detach().clone());
      }
      out = std::make_unique<WholeInferenceModel>(model, std::move(gpt), device);
      return absl::OkStatus();
    }
    auto observer = std::make_unique<SilentObserver>();
    MemoryOptions loading = *memory;
    loading.values_from_checkpoint = false;
    ASSIGN_OR_RETURN(std::unique_ptr<ChunkedEngine> engine,
                     ChunkedEngine::Create(std::move(gpt), options, loading, device, {}, observer.get()));
    out = std::make_unique<ChunkedInferenceModel>(model, std::move(engine), std::move(observer), nullptr);
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace ferry
