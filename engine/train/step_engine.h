#pragma once

// The trainer's, restore's and inference models' shared engine: the step
// engines that run a GPT on a device, and what building one outside
// training needs. Internal to engine/train, not a public API.

#include <ATen/Tensor.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/memory/chunk_manager.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/memory_options.h"
#include "engine/model/gpt.h"
#include "engine/optim/loss_scaler.h"
#include "engine/parallel/communicator.h"
#include "engine/train/train_options.h"
#include "engine/train/training_observer.h"

namespace ferry {

// One training step, whichever engine runs it.
class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // Forward and backward of each of `micro_batches` equal row ranges of
  // the batch (gradients summed), then one update; returns the loss (the
  // mean over the micro-batches) and the gradient norm.
  virtual absl::Status Step(const torch::Tensor& inputs, const torch::Tensor& targets, int micro_batches,
                            double lr, double* loss, double* grad_norm) = 0;
  // The mean loss per token of a batch in evaluation mode (no dropout, no
  // gradients, nothing updated), over the whole global batch.
  virtual double Evaluate(const torch::Tensor& inputs, const torch::Tensor& targets) = 0;
  // Fills the memory part of the report.
  virtual void Report(StepReport* report) = 0;
  virtual std::string ExplainOutOfMemory(const std::string& what) const = 0;
  // This engine's part of a checkpoint, as files named `prefix` + "...":
  // held in `contents->files`, or in `contents->produced` to be written
  // before the next step.
  virtual absl::Status SaveState(const std::string& prefix, CheckpointContents* contents) {
    (void)prefix;
    (void)contents;
    return absl::UnimplementedError("checkpoints need the memory manager's chunks");
  }
  virtual absl::Status RestoreState(const std::string& prefix, const CheckpointContents& contents) {
    (void)prefix;
    (void)contents;
    return absl::UnimplementedError("checkpoints need the memory manager's chunks");
  }
};

// The plain LibTorch loop (the baseline the memory manager is measured
// against): the whole model on `device`, which must outlive the engine;
// torch::optim::AdamW. No checkpoints.
std::unique_ptr<StepEngine> MakePlainEngine(Gpt model, const TrainOptions& options, MemoryDevice* device);

// The model's data in chunks, placed by the memory manager; the forward run
// stage by stage: the embeddings, each block, the head with the loss.
class ChunkedEngine : public StepEngine {
 public:
  static absl::StatusOr<std::unique_ptr<ChunkedEngine>> Create(Gpt model, const TrainOptions& train,
                                                               MemoryOptions memory, MemoryDevice* device,
                                                               ManagerGroups groups, TrainingObserver* observer);

  absl::Status Step(const torch::Tensor& inputs, const torch::Tensor& targets, int micro_batches, double lr,
                    double* loss, double* grad_norm) override;
  double Evaluate(const torch::Tensor& inputs, const torch::Tensor& targets) override;
  void Report(StepReport* report) override;
  std::string ExplainOutOfMemory(const std::string& what) const override;
  absl::Status SaveState(const std::string& prefix, CheckpointContents* contents) override;
  absl::Status RestoreState(const std::string& prefix, const CheckpointContents& contents) override;

  // The fp32 logits of each row's last position (GptImpl::LastLogits) in
  // evaluation mode: each stage's chunks fetched as its forward needs them.
  // With `cache`, of the positions after those it holds, which it then
  // holds too (generation).
  at::Tensor LastLogits(const torch::Tensor& tokens, KvCache* cache = nullptr);

  // Every parameter's fp32 (master) value, named as the model names it, on
  // the CPU.
  std::vector<std::pair<std::string, at::Tensor>> NamedParameterValues() const;

 private:
  ChunkedEngine(Gpt model, const TrainOptions& train, MemoryDevice* device, ManagerGroups groups,
                TrainingObserver* observer);

  absl::Status Init(MemoryOptions memory);

  // What the head's stages compute (ModelStages): with one vocabulary piece
  // `whole` is the head stage; with several, `norm` is the first and
  // `piece` each piece's, whose results `combine` joins.
  struct Head {
    std::function<at::Tensor(const at::Tensor&)> whole;
    std::function<at::Tensor(const at::Tensor&)> norm;
    std::function<at::Tensor(int, const at::Tensor&)> piece;
    std::function<at::Tensor(const std::vector<at::Tensor>&)> combine;
  };
  // The loss against `targets`; the fp32 logits of each row's last position.
  Head LossHead(const torch::Tensor& targets);
  Head LogitsHead();

  // The forward stage by stage, each stage's chunks fetched as it needs
  // them: the embeddings' pieces, the blocks, the head's stages. With
  // `cache` (evaluation only), of the positions after its.
  at::Tensor Forward(const torch::Tensor& tokens, const Head& head, KvCache* cache = nullptr);
  // The blocks that recomputing `stages` run.
  std::vector<int> BlocksOf(const std::vector<int>& stages) const;
  // Forward() in evaluation mode (no dropout, no gradients).
  at::Tensor EvalForward(const torch::Tensor& tokens, const Head& head, KvCache* cache = nullptr);

  Gpt model_;
  ModelStages stages_;
  TrainOptions train_;
  MemoryDevice* device_;
  ManagerGroups groups_;
  TrainingObserver* observer_;
  std::unique_ptr<ChunkManager> manager_;
  StepMemoryStats stats_;
  StepReport::Times times_;
  // fp16 only.
  std::unique_ptr<DynamicLossScaler> scaler_;
  // Updates applied (skipped steps do not count), for bias correction.
  int64_t updates_ = 0;
  bool skipped_ = false;
  double used_scale_ = 1.0;
};

// Only a group's shape, for building a rank's part of the model outside
// training: every collective is an error.
class PlaceOnlyCommunicator : public Communicator {
 public:
  PlaceOnlyCommunicator(int rank, int size, std::string name = "tensor")
      : name_(std::move(name)), rank_(rank), size_(size) {}
  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduce(at::Tensor&, ReduceOp) override { Refuse(); }
  std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor, at::Tensor) override { Refuse(); }
  void AllGatherInto(const at::Tensor&, const at::Tensor&) override { Refuse(); }
  at::Tensor AllGather(const at::Tensor&, int64_t) override { Refuse(); }
  void Broadcast(at::Tensor&, int) override { Refuse(); }
  void Barrier() override { Refuse(); }

 private:
  [[noreturn]] static void Refuse() {
    throw std::logic_error("restoring a checkpoint ran a collective; it must not need the other ranks");
  }
  const std::string name_;
  int rank_;
  int size_;
};

// Reports nowhere: the observer of an engine built outside training.
class SilentObserver : public TrainingObserver {
 public:
  void OnStep(const StepReport&) override {}
};

}  // namespace ferry
