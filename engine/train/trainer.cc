#include "engine/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/host_info.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/optim/loss_scaler.h"
#include "engine/train/gpt2_import.h"
#include "engine/train/lr_schedule.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

uint64_t TensorBytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
}

bool Decays(const torch::Tensor& p) { return p.dim() >= 2; }

// Whether bf16 matrix products compute natively on the CPU.
bool NativeCpuBf16(const TrainOptions& train, c10::ScalarType dtype) {
  if (dtype != at::kBFloat16) return false;
  switch (train.cpu_bf16_matmul) {
    case TrainOptions::CpuBf16Matmul::kNative:
      return true;
    case TrainOptions::CpuBf16Matmul::kFp32:
      return false;
    case TrainOptions::CpuBf16Matmul::kAuto:
      break;
  }
  return CpuHasBf16Arithmetic();
}

// A generator's state (a byte tensor) as a checkpoint file, and back.
std::string StateBytes(const at::Tensor& state) {
  const at::Tensor bytes = state.to(at::kCPU).contiguous();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}
at::Tensor StateFromBytes(const std::string& bytes) {
  at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  return state;
}

// Gradient accumulation: which rows of a rank's share of the batch each
// micro-batch takes (consecutive ranges, in order), and the dropout masks it
// draws. Every micro-batch starts from the generators' state at the start of
// the step and draws, for its rows, the masks of the whole global batch
// (GptImpl::SetBatchShare): so it drops what one pass over the whole batch
// would, and the last leaves the generators where that pass would.
class MicroBatches {
 public:
  // `model`'s batch share as set for the whole step (its rank's rows of the
  // global batch; none with one data rank).
  MicroBatches(GptImpl* model, int count, int64_t rank_rows, c10::Device device)
      : model_(model),
        count_(count),
        rows_(rank_rows / count),
        device_(device),
        whole_(model->compute_mode().batch_whole > 0 ? model->compute_mode().batch_whole : rank_rows),
        first_row_(model->compute_mode().batch_offset) {
    if (count_ > 1) start_ = SaveGenerators(device_);
  }
  // The step's share back, for the next step.
  ~MicroBatches() {
    if (count_ > 1) model_->SetBatchShare(whole_, first_row_);
  }
  MicroBatches(const MicroBatches&) = delete;
  MicroBatches& operator=(const MicroBatches&) = delete;

  int count() const { return count_; }
  // Rows [m * rows, (m + 1) * rows) of `t`, the rank's share.
  torch::Tensor Rows(const torch::Tensor& t, int m) const { return count_ == 1 ? t : t.narrow(0, m * rows_, rows_); }
  // Before micro-batch `m`'s forward.
  void Enter(int m) {
    if (count_ == 1) return;
    RestoreGenerators(device_, start_);
    model_->SetBatchShare(whole_, first_row_ + m * rows_);
  }
  // The scale of a micro-batch's loss (a mean over its rows) before its
  // backward, so that the summed gradients are the whole batch's mean's.
  double LossScale() const { return 1.0 / count_; }

 private:
  GptImpl* model_;
  int count_;
  int64_t rows_;
  c10::Device device_;
  int64_t whole_;
  int64_t first_row_;
  GeneratorStates start_;
};

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

// The plain LibTorch loop: the model on the device, torch::optim::AdamW.
class PlainEngine : public StepEngine {
 public:
  PlainEngine(Gpt model, const TrainOptions& options, MemoryDevice* device)
      : model_(std::move(model)), device_(device) {
    model_->to(device->compute_device());
    // On the simulated device the model was built as host memory; give it
    // device memory so that it counts against the capacity.
    if (device->compute_device().is_cpu()) {
      for (torch::Tensor& p : model_->parameters()) p.set_data(p.detach().clone());
      for (torch::Tensor& b : model_->buffers()) b.set_data(b.detach().clone());
    }
    params_ = model_->parameters();
    std::vector<torch::Tensor> decay, no_decay;
    for (const torch::Tensor& p : params_) (Decays(p) ? decay : no_decay).push_back(p);
    auto adamw = [&](double weight_decay) {
      auto o = std::make_unique<torch::optim::AdamWOptions>(options.lr);
      o->betas({options.beta1, options.beta2}).eps(options.eps).weight_decay(weight_decay);
      return o;
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, adamw(options.weight_decay));
    groups.emplace_back(no_decay, adamw(0.0));
    optimizer_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(options.lr));
    max_norm_ = options.grad_clip > 0 ? options.grad_clip : std::numeric_limits<double>::infinity();
  }

  absl::Status Step(const torch::Tensor& inputs, const torch::Tensor& targets, int micro_batches, double lr,
                    double* loss, double* grad_norm) override {
    for (auto& group : optimizer_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer_->zero_grad();
    MicroBatches micro(model_.get(), micro_batches, inputs.size(0), device_->compute_device());
    double loss_sum = 0, forward_seconds = 0, backward_seconds = 0;
    Clock::time_point backward_end;
    for (int m = 0; m < micro.count(); ++m) {
      micro.Enter(m);
      const Clock::time_point start = Clock::now();
      torch::Tensor l = model_->Loss(model_->forward(micro.Rows(inputs, m)), micro.Rows(targets, m));
      loss_sum += l.item<double>();
      const Clock::time_point forward_end = Clock::now();
      (micro.count() > 1 ? l * micro.LossScale() : l).backward();
      backward_end = Clock::now();
      forward_seconds += Seconds(start, forward_end);
      backward_seconds += Seconds(forward_end, backward_end);
    }
    *loss = loss_sum / micro.count();
    const Clock::time_point clip_start = Clock::now();
    *grad_norm = torch::nn::utils::clip_grad_norm_(params_, max_norm_);
    const Clock::time_point clip_end = Clock::now();
    optimizer_->step();
    times_.forward = forward_seconds;
    times_.backward = backward_seconds + Seconds(clip_start, clip_end);
    times_.optimizer = Seconds(clip_end, Clock::now());
    return absl::OkStatus();
  }

  double Evaluate(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    model_->eval();
    auto train_again = absl::MakeCleanup([&] { model_->train(); });
    torch::NoGradGuard no_grad;
    return model_->Loss(model_->forward(inputs), targets).item<double>();
  }

  void Report(StepReport* report) override {
    uint64_t param_bytes = 0, grad_bytes = 0, state_bytes = 0;
    for (const torch::Tensor& p : params_) {
      param_bytes += TensorBytes(p);
      grad_bytes += TensorBytes(p.grad());
    }
    for (const auto& entry : optimizer_->state()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
      state_bytes += TensorBytes(state.exp_avg()) + TensorBytes(state.exp_avg_sq());
    }
    report->times = times_;
    const uint64_t model = param_bytes + grad_bytes + state_bytes;
    const uint64_t in_use = device_->allocated_bytes();
    report->device_memory_bytes = in_use;
    report->memory = {{"device", "param", param_bytes},
                      {"device", "grad", grad_bytes},
                      {"device", "optimizer", state_bytes},
                      {"device", "activation", in_use > model ? in_use - model : 0}};
  }

  std::string ExplainOutOfMemory(const std::string& what) const override {
    return absl::StrCat("out of device memory with the whole model on the device: ", what);
  }

 private:
  Gpt model_;
  MemoryDevice* device_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  double max_norm_;
  StepReport::Times times_;
};

// The model's data in chunks, placed by the memory manager; the forward run
// stage by stage: the embeddings, each block, the head with the loss.
class ChunkedEngine : public StepEngine {
 public:
  static absl::StatusOr<std::unique_ptr<ChunkedEngine>> Create(Gpt model, const TrainOptions& train,
                                                               MemoryOptions memory, MemoryDevice* device,
                                                               ManagerGroups groups, TrainingObserver* observer) {
    std::unique_ptr<ChunkedEngine> e(new ChunkedEngine(std::move(model), train, device, groups, observer));
    RETURN_IF_ERROR(e->Init(std::move(memory)));
    return e;
  }

  absl::Status Step(const torch::Tensor& inputs, const torch::Tensor& targets, int micro_batches, double lr,
                    double* loss, double* grad_norm) override {
    GptImpl& gpt = *model_;
    const double scale = scaler_ ? scaler_->scale() : 1.0;
    used_scale_ = scale;
    MicroBatches micro(model_.get(), micro_batches, inputs.size(0), device_->compute_device());
    // fp16: every micro-batch's gradients carry the step's loss scale, and
    // an overflow in any of them makes the summed gradients overflow.
    const double backward_scale = micro.count() > 1 ? scale * micro.LossScale() : scale;
    manager_->BeginStep(micro.Rows(inputs, 0).sizes().vec(), micro.count());
    double loss_sum = 0, forward_seconds = 0, backward_seconds = 0;
    Clock::time_point backward_end;
    for (int m = 0; m < micro.count(); ++m) {
      micro.Enter(m);
      const Clock::time_point start = Clock::now();
      const torch::Tensor micro_targets = micro.Rows(targets, m);
      torch::Tensor x =
          manager_->RunStage(0, micro.Rows(inputs, m), [&](const torch::Tensor& t) { return gpt.Embed(t); });
      for (int64_t i = 0; i < gpt.block_count(); ++i) {
        // By value: a recomputing block runs this again in the backward.
        GptImpl* model = &gpt;
        x = manager_->RunStage(static_cast<int>(1 + i), x,
                               [model, i](const torch::Tensor& t) { return model->block(i).forward(t); });
      }
      torch::Tensor l = manager_->RunStage(static_cast<int>(gpt.block_count() + 1), x, [&](const torch::Tensor& t) {
        return gpt.HeadLoss(t, micro_targets);
      });
      loss_sum += l.item<double>();
      const Clock::time_point forward_end = Clock::now();
      (backward_scale != 1.0 ? l * backward_scale : l).backward();
      l = torch::Tensor();
      x = torch::Tensor();
      RETURN_IF_ERROR(manager_->FinishBackward());
      backward_end = Clock::now();
      forward_seconds += Seconds(start, forward_end);
      backward_seconds += Seconds(forward_end, backward_end);
    }
    *loss = loss_sum / micro.count();
    if (groups_.data != nullptr && groups_.data->size() > 1) {
      // The global batch's loss: the mean of the data ranks' shares.
      at::Tensor sum = at::full({1}, *loss, at::kDouble);
      groups_.data->AllReduce(sum);
      *loss = sum.item<double>() / groups_.data->size();
    }
    const OptimizerResult result = manager_->OptimizerStep(updates_ + 1, lr, train_.grad_clip, scale);
    *grad_norm = result.grad_norm;
    skipped_ = result.skipped;
    if (!result.skipped) ++updates_;
    if (scaler_) {
      scaler_->Update(result.skipped);
    } else if (result.skipped) {
      return absl::FailedPreconditionError(
          "the gradients are not finite; lower train.lr, set train.grad_clip, or use fp32 or bf16");
    }
    stats_ = manager_->EndStep();
    // The forward waits for the last step's updates running beside it
    // where it reaches their chunks: that wait is the optimizer's.
    times_.forward = std::max(0.0, forward_seconds - stats_.update_wait_seconds);
    times_.backward = backward_seconds;
    times_.optimizer = Seconds(backward_end, Clock::now()) + stats_.update_wait_seconds;
    times_.transfers = stats_.transfer_seconds;
    times_.disk = stats_.disk_wait_seconds;
    observer_->OnPlacement(manager_->Placement());
    return absl::OkStatus();
  }

  double Evaluate(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    double loss = EvalForward(inputs, [&](const torch::Tensor& x) { return model_->HeadLoss(x, targets); })
                      .item<double>();
    if (groups_.data != nullptr && groups_.data->size() > 1) {
      at::Tensor sum = at::full({1}, loss, at::kDouble);
      groups_.data->AllReduce(sum);
      loss = sum.item<double>() / groups_.data->size();
    }
    return loss;
  }

  void Report(StepReport* report) override {
    report->times = times_;
    report->memory_stats = stats_;
    report->device_memory_bytes = stats_.peak_device_bytes;
    static const char* kKinds[] = {"param", "grad", "optimizer"};
    for (int k = 0; k < 3; ++k) {
      report->memory.push_back({"device", kKinds[k], stats_.device_bytes[k]});
      report->memory.push_back({"host", kKinds[k], stats_.host_bytes[k]});
      if (manager_->tier_plan().disk_bytes > 0) report->memory.push_back({"disk", kKinds[k], stats_.disk_bytes[k]});
    }
    report->memory.push_back({"device", "activation", stats_.peak_non_model_bytes});
    report->loss_scale = used_scale_;
    report->skipped = skipped_;
    report->skipped_steps = scaler_ ? scaler_->skipped_steps() : 0;
    // Stage 1 + i is block i.
    for (int stage : stats_.recomputed_stages) report->recomputed_blocks.push_back(stage - 1);
  }

  std::string ExplainOutOfMemory(const std::string& what) const override {
    return manager_->ExplainOutOfMemory(what);
  }

  absl::Status SaveState(const std::string& prefix, CheckpointContents* contents) override {
    // A snapshot lets training go on while the file is written; where the
    // host budget has no room for one, the state is streamed to the file
    // from wherever each chunk lives, and training waits for it.
    if (manager_->StateSnapshotFits()) {
      std::string state;
      state.reserve(manager_->StateBytes());
      RETURN_IF_ERROR(manager_->SaveState([&](const void* data, size_t size) {
        state.append(static_cast<const char*>(data), size);
        return absl::OkStatus();
      }));
      contents->files[prefix + "chunks"] = std::move(state);
    } else {
      contents->produced[prefix + "chunks"] = [manager = manager_.get()](const ByteSink& sink) {
        return manager->SaveState(sink);
      };
    }
    contents->files[prefix + "engine"] = absl::StrCat(updates_, " ", scaler_ ? scaler_->State() : "-");
    return absl::OkStatus();
  }

  absl::Status RestoreState(const std::string& prefix, const CheckpointContents& contents) override {
    absl::StatusOr<CheckpointFileReader> chunks = CheckpointFileReader::Open(contents, prefix + "chunks");
    auto engine = contents.files.find(prefix + "engine");
    if (!chunks.ok() || engine == contents.files.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: no ", prefix, "chunks or ", prefix,
                                                     "engine; it was written for another parallel layout"));
    }
    RETURN_IF_ERROR(manager_->RestoreState(chunks->size(), [&](void* data, size_t size) {
      return chunks->Read(data, size);
    }));
    const std::vector<std::string> parts = absl::StrSplit(engine->second, absl::MaxSplits(' ', 1));
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &updates_) ||
        (scaler_ != nullptr && !scaler_->Restore(parts[1]))) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", prefix, "engine is damaged or from another precision"));
    }
    return absl::OkStatus();
  }

  // The fp32 logits of each row's last position (GptImpl::LastLogits) in
  // evaluation mode: each stage's chunks fetched as its forward needs them.
  // With `cache`, of the positions after those it holds, which it then
  // holds too (generation).
  at::Tensor LastLogits(const torch::Tensor& tokens, KvCache* cache = nullptr) {
    return EvalForward(tokens, [&](const torch::Tensor& x) { return model_->LastLogits(x); }, cache);
  }

  // The forward in evaluation mode (no dropout, no gradients), each stage's
  // chunks fetched as it needs them; `head` runs as the last stage. With
  // `cache`, of the positions after its.
  at::Tensor EvalForward(const torch::Tensor& tokens, const std::function<at::Tensor(const at::Tensor&)>& head,
                         KvCache* cache = nullptr) {
    GptImpl& gpt = *model_;
    gpt.eval();
    manager_->BeginEval();
    auto train_again = absl::MakeCleanup([&] {
      manager_->EndEval();
      gpt.train();
    });
    const int64_t first = cache != nullptr ? cache->positions() : 0;
    if (cache != nullptr) cache->layers.resize(static_cast<size_t>(gpt.block_count()));
    torch::Tensor x = manager_->RunStage(0, tokens, [&](const torch::Tensor& t) { return gpt.Embed(t, first); });
    for (int64_t i = 0; i < gpt.block_count(); ++i) {
      KvCacheLayer* layer = cache != nullptr ? &cache->layers[static_cast<size_t>(i)] : nullptr;
      x = manager_->RunStage(static_cast<int>(1 + i), x,
                             [&](const torch::Tensor& t) { return gpt.block(i).forward(t, layer); });
    }
    return manager_->RunStage(static_cast<int>(gpt.block_count() + 1), x, head);
  }

  // Every parameter's fp32 (master) value, named as the model names it, on
  // the CPU.
  std::vector<std::pair<std::string, at::Tensor>> NamedParameterValues() const {
    const std::vector<at::Tensor> values = manager_->ParameterValues();
    std::vector<std::pair<std::string, at::Tensor>> named;
    size_t i = 0;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), values.at(i++));
    return named;
  }

 private:
  ChunkedEngine(Gpt model, const TrainOptions& train, MemoryDevice* device, ManagerGroups groups,
                TrainingObserver* observer)
      : model_(std::move(model)), train_(train), device_(device), groups_(groups), observer_(observer) {}

  absl::Status Init(MemoryOptions memory) {
    // Buffers (the rotary tables) live on the device; parameters go to chunks.
    for (torch::Tensor& b : model_->buffers()) {
      b.set_data(b.detach().to(device_->compute_device(), /*non_blocking=*/false, /*copy=*/true));
    }
    std::vector<ManagedParam> params;
    std::map<std::string, int> index;
    for (const auto& item : model_->named_parameters()) {
      index[item.key()] = static_cast<int>(params.size());
      params.push_back({item.key(), item.value(), Decays(item.value()), !IsTensorParallelShard(model_->config(), item.key())});
    }
    // A model built without its values gets them straight in its chunks,
    // one parameter at a time.
    if (model_->deferred()) {
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].init = [gpt = model_.get(), i](at::Tensor flat) { gpt->InitialValue(i, flat); };
        params[i].init_scratch_bytes = model_->InitialValueScratchBytes(i);
      }
    }
    // Stages as the model's shapes say (the embeddings, each block, the
    // head); a tied output layer is the embedding's weight, used by both.
    std::vector<StageParams> stages;
    stages.push_back({"embed", {}});
    for (int64_t i = 0; i < model_->block_count(); ++i) {
      stages.push_back({absl::StrCat("h.", i), {}, /*recomputable=*/true});
    }
    stages.push_back({"head", {}});
    for (const ParameterShape& shape : ModelParameterShapes(model_->config())) {
      stages.at(static_cast<size_t>(shape.stage)).params.push_back(index.at(shape.name));
    }
    if (model_->config().tied) stages.back().params.push_back(index.at("wte.weight"));
    if (memory.chunk_step_elements <= 0) memory.chunk_step_elements = model_->config().hidden;
    OptimizerOptions optimizer;
    optimizer.beta1 = train_.beta1;
    optimizer.beta2 = train_.beta2;
    optimizer.eps = train_.eps;
    optimizer.weight_decay = train_.weight_decay;
    optimizer.overlap = train_.overlap_optimizer;
    switch (train_.precision) {
      case TrainOptions::Precision::kFp32:
        break;
      case TrainOptions::Precision::kFp16: {
        optimizer.param_dtype = at::kHalf;
        LossScalerOptions scaling;
        scaling.initial_scale = train_.loss_scale;
        scaling.growth_interval = train_.loss_scale_growth_interval;
        scaler_ = std::make_unique<DynamicLossScaler>(scaling);
        break;
      }
      case TrainOptions::Precision::kBf16:
        optimizer.param_dtype = at::kBFloat16;
        break;
    }
    // Reduced-precision matrix products run natively where the device has
    // fast kernels for them: CUDA, and for bf16 a CPU that multiplies bf16.
    ComputeMode mode = model_->compute_mode();
    mode.dtype = optimizer.param_dtype;
    mode.upcast = device_->compute_device().is_cpu() && !NativeCpuBf16(train_, mode.dtype);
    model_->SetComputeMode(mode);
    if (device_->compute_device().is_cpu() && mode.dtype == at::kBFloat16) {
      observer_->OnLog(LogLevel::kInfo,
                       mode.upcast ? std::string("compute: bf16 matrix products in fp32 (this CPU has no bf16 "
                                                 "arithmetic, or train.cpu_bf16_matmul says fp32)")
                                   : std::string("compute: bf16 matrix products native (bf16 inputs, fp32 "
                                                 "accumulation, bf16 results)"));
    }
    // Filling a large model's chunks takes minutes: say how far it is (at
    // most every 10 s), and stop there when asked to.
    const auto fill_start = std::chrono::steady_clock::now();
    auto last_said = fill_start;
    auto on_filled = [&](int filled, int chunks) {
      const auto now = std::chrono::steady_clock::now();
      if (filled == chunks ? now - fill_start >= std::chrono::seconds(10)
                           : now - last_said >= std::chrono::seconds(10)) {
        last_said = now;
        observer_->OnLog(LogLevel::kInfo,
                         absl::StrFormat("memory: %d of %d chunks filled with their initial values (%.0f s)", filled,
                                         chunks, std::chrono::duration<double>(now - fill_start).count()));
      }
      return !observer_->StopRequested();
    };
    ASSIGN_OR_RETURN(manager_, ChunkManager::Create(device_, std::move(params), std::move(stages), memory,
                                                    optimizer, groups_, on_filled));
    // The model's products write the chunks' gradients (gradient_claims.h).
    ComputeMode claiming = model_->compute_mode();
    claiming.claims = manager_.get();
    model_->SetComputeMode(claiming);
    const ChunkLayout& layout = manager_->layout();
    observer_->OnLog(LogLevel::kInfo,
                     absl::StrFormat("memory: %d chunks of %d elements (%.2f%% unused), %s policy on %s "
                                     "with %.1f MiB",
                                     layout.chunk_count(), layout.chunk_elements,
                                     100.0 * layout.waste_fraction(), PolicyName(memory.policy),
                                     device_->name(), double(device_->capacity_bytes()) / (1 << 20)));
    const TierPlan& tiers = manager_->tier_plan();
    if (tiers.disk_bytes > 0) {
      observer_->OnLog(LogLevel::kInfo,
                       absl::StrFormat("memory: gradients of %d and optimizer states of %d of %d chunks on disk "
                                       "(%s in %s), host side %s of %s",
                                       tiers.grad_chunks_on_disk(), tiers.optimizer_chunks_on_disk(),
                                       layout.chunk_count(), BytesText(tiers.disk_bytes), manager_->disk_dir(),
                                       BytesText(tiers.host_bytes), BytesText(memory.host_budget_bytes)));
    }
    return absl::OkStatus();
  }

  Gpt model_;
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

}  // namespace

Trainer::Trainer(ModelConfig model, TrainOptions options, EngineOptions engine,
                 std::unique_ptr<TokenSource> data, TrainingObserver* observer)
    : model_config_(model),
      options_(options),
      engine_(std::move(engine)),
      data_(std::move(data)),
      observer_(observer) {}

absl::Status Trainer::Run() {
  return CallTorch("training", [&]() -> absl::Status { return RunSteps(); });
}

absl::Status Trainer::RunSteps() {
  if (engine_.device == nullptr) return absl::InvalidArgumentError("Trainer: no device");
  MemoryDevice* device = engine_.device;
  if (options_.threads > 0) torch::set_num_threads(options_.threads);
  // The device's generators, and this trainer's own CPU one (initial
  // values, dropout): ranks run as threads of one process each have theirs.
  torch::manual_seed(options_.seed);
  CpuGeneratorScope generator(at::make_generator<at::CPUGeneratorImpl>(options_.seed));
  const int tensor_ranks = engine_.tensor != nullptr ? engine_.tensor->size() : 1;
  const int data_ranks = engine_.data != nullptr ? engine_.data->size() : 1;
  if (options_.batch_size % data_ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.batch_size: ", options_.batch_size,
                                                   " does not split across ", data_ranks,
                                                   " data-parallel ranks; use a multiple of ", data_ranks));
  }
  const int64_t micro_batches = options_.grad_accum_steps;
  if (micro_batches < 1 || micro_batches > options_.batch_size ||
      options_.batch_size % (micro_batches * data_ranks) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.grad_accum_steps: ", micro_batches, " micro-batches", data_ranks > 1 ? " on each of " : "",
        data_ranks > 1 ? absl::StrCat(data_ranks, " data-parallel ranks") : "", " do not split train.batch_size ",
        options_.batch_size, "; use a train.batch_size that is a multiple of ", micro_batches * data_ranks,
        " or a train.grad_accum_steps that divides ", options_.batch_size / data_ranks));
  }

  // The model is built (and initialised) on the CPU as host memory, the same
  // way whatever the device, so every placement starts from the same values.
  Gpt model(nullptr);
  {
    HostAllocationScope host;
    // For the chunks, built block by block without its values (they are
    // drawn into the chunks); whole for the plain loop.
    const bool from_file = !engine_.init_from.empty() && engine_.resume == nullptr;
    model = Gpt(model_config_, engine_.tensor,
                engine_.memory.has_value() || from_file ? GptImpl::ParameterInit::kDeferred
                                                        : GptImpl::ParameterInit::kNow);
    model->train();
    if (from_file) {
      RETURN_IF_ERROR(InitFromWeights(engine_.init_from, model_config_, *model));
      // The plain loop holds the model whole.
      if (!engine_.memory.has_value()) {
        RETURN_IF_ERROR(CallTorch(absl::StrCat("reading ", engine_.init_from), [&] { model->Materialize(); }));
      }
    }
    if (data_ranks > 1 || micro_batches > 1) {
      const int data_rank = engine_.data != nullptr ? engine_.data->rank() : 0;
      model->SetBatchShare(options_.batch_size, data_rank * (options_.batch_size / data_ranks));
    }
  }
  std::unique_ptr<StepEngine> engine;
  if (engine_.memory.has_value()) {
    MemoryOptions memory = *engine_.memory;
    memory.values_from_checkpoint = engine_.resume != nullptr;
    ASSIGN_OR_RETURN(engine, ChunkedEngine::Create(std::move(model), options_, memory, device,
                                                   {engine_.tensor, engine_.data}, observer_));
  } else {
    if (options_.precision != TrainOptions::Precision::kFp32) {
      return absl::InvalidArgumentError("mixed precision needs the memory manager's chunks");
    }
    if (tensor_ranks * data_ranks > 1) {
      return absl::InvalidArgumentError("parallel training needs the memory manager's chunks");
    }
    engine = std::make_unique<PlainEngine>(std::move(model), options_, device);
  }
  // This rank's files in a checkpoint.
  const int world_rank = (engine_.data != nullptr ? engine_.data->rank() : 0) * tensor_ranks +
                         (engine_.tensor != nullptr ? engine_.tensor->rank() : 0);
  const std::string prefix = absl::StrCat("rank", world_rank, ".");
  const std::string world = absl::StrCat(tensor_ranks, "x", data_ranks);
  int64_t first_step = 0;
  if (engine_.resume != nullptr) {
    const CheckpointContents& resume = *engine_.resume;
    auto it = resume.meta.find("world");
    if (it == resume.meta.end() || it->second != world) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: written by a world of ",
                                                     it == resume.meta.end() ? "?" : it->second,
                                                     " (tensor x data) ranks, this run has ", world));
    }
    const Clock::time_point restore_start = Clock::now();
    RETURN_IF_ERROR(engine->RestoreState(prefix, resume));
    observer_->OnLog(LogLevel::kInfo, absl::StrFormat("checkpoint: the state of step %d restored in %.1f s",
                                                      resume.step, Seconds(restore_start, Clock::now())));
    auto generator = resume.files.find(prefix + "generator");
    auto position = resume.files.find(prefix + "data");
    if (generator == resume.files.end() || position == resume.files.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: no ", prefix, "generator or ", prefix, "data"));
    }
    RETURN_IF_ERROR(data_->RestorePosition(position->second));
    auto device_generator = resume.files.find(prefix + "device_generator");
    RestoreGenerators(device->compute_device(),
                      {StateFromBytes(generator->second), device_generator == resume.files.end()
                                                              ? at::Tensor()
                                                              : StateFromBytes(device_generator->second)});
    first_step = resume.step;
  }
  auto checkpoint = [&](int64_t steps_done) -> absl::Status {
    const Clock::time_point snapshot_start = Clock::now();
    CheckpointContents c;
    c.step = steps_done;
    c.meta["world"] = world;
    RETURN_IF_ERROR(engine->SaveState(prefix, &c));
    c.files[prefix + "data"] = data_->SavePosition();
    const GeneratorStates generators = SaveGenerators(device->compute_device());
    c.files[prefix + "generator"] = StateBytes(generators.cpu);
    if (generators.device.defined()) c.files[prefix + "device_generator"] = StateBytes(generators.device);
    const double snapshot_seconds = std::chrono::duration<double>(Clock::now() - snapshot_start).count();
    return engine_.on_checkpoint(std::move(c), snapshot_seconds);
  };
  observer_->OnStarted({device->name(), model_config_.ParameterCount(), options_.steps});

  const int64_t batch = options_.batch_size;
  const int64_t time = model_config_.seq_len;
  std::vector<int64_t> window_tokens;
  // A data rank's rows of a global batch of windows, on the device: inputs
  // and next-token targets.
  auto rank_rows = [&](std::vector<int64_t>& windows) {
    const int64_t rows = batch / data_ranks;
    const int64_t first = (engine_.data != nullptr ? engine_.data->rank() : 0) * rows;
    torch::Tensor w = torch::from_blob(windows.data(), {batch, time + 1}, torch::kLong)
                          .narrow(0, first, rows)
                          .to(device->compute_device(), /*non_blocking=*/false, /*copy=*/true);
    return std::pair(w.slice(1, 0, time), w.slice(1, 1, time + 1));
  };
  // Evaluation: the same windows every time, drawn by the eval source from
  // where it stood when training started.
  std::string eval_start;
  if (engine_.eval_data != nullptr) eval_start = engine_.eval_data->SavePosition();
  std::vector<int64_t> eval_tokens;
  auto evaluate = [&](int64_t steps_done) -> absl::StatusOr<StepReport::Eval> {
    const Clock::time_point eval_start_time = Clock::now();
    RETURN_IF_ERROR(engine_.eval_data->RestorePosition(eval_start));
    double sum = 0;
    for (int64_t b = 0; b < options_.eval_batches; ++b) {
      engine_.eval_data->SampleWindows(batch, time + 1, &eval_tokens);
      try {
        // In micro-batches, as training runs: no more activations at once.
        auto [inputs, targets] = rank_rows(eval_tokens);
        const int64_t rows = inputs.size(0) / micro_batches;
        for (int64_t m = 0; m < micro_batches; ++m) {
          sum += engine->Evaluate(inputs.narrow(0, m * rows, rows), targets.narrow(0, m * rows, rows)) /
                 static_cast<double>(micro_batches);
        }
      } catch (const c10::OutOfMemoryError& e) {
        return absl::ResourceExhaustedError(
            absl::StrCat("evaluation after step ", steps_done, ": out of device memory (",
                         e.what_without_backtrace(), "); lower train.batch_size or raise memory.device_budget"));
      }
    }
    StepReport::Eval eval;
    eval.step = steps_done;
    eval.loss = sum / static_cast<double>(std::max<int64_t>(1, options_.eval_batches));
    eval.tokens = options_.eval_batches * batch * time;
    eval.seconds = Seconds(eval_start_time, Clock::now());
    observer_->OnLog(LogLevel::kInfo, absl::StrFormat("eval: loss %.4f (perplexity %.2f) %s, %d tokens in %.1f s",
                                                      eval.loss, std::exp(eval.loss),
                                                      steps_done == 0 ? std::string("before training")
                                                                      : absl::StrCat("after step ", steps_done),
                                                      eval.tokens, eval.seconds));
    return eval;
  };
  std::optional<StepReport::Eval> initial_eval;
  if (engine_.eval_data != nullptr && first_step == 0 && first_step < options_.steps) {
    ASSIGN_OR_RETURN(initial_eval, evaluate(0));
  }
  int64_t tokens_seen = first_step * batch * time;
  const Clock::time_point start = Clock::now();

  for (int64_t step = first_step; step < options_.steps; ++step) {
    bool stop = observer_->StopRequested();
    if (tensor_ranks * data_ranks > 1) {
      // Every rank stops after the same step, or the others would wait in
      // the next step's collectives: stop if any rank was asked to.
      at::Tensor any = at::full({1}, stop ? 1.0f : 0.0f);
      if (engine_.tensor != nullptr) engine_.tensor->AllReduce(any, ReduceOp::kMax);
      if (engine_.data != nullptr) engine_.data->AllReduce(any, ReduceOp::kMax);
      stop = any.item<float>() > 0;
    }
    if (stop) {
      // Asked to stop (a cancel, or SIGTERM to the worker): keep what was
      // done since the last checkpoint.
      if (engine_.on_checkpoint && engine_.checkpoint_every_steps > 0 && step > first_step &&
          step % engine_.checkpoint_every_steps != 0) {
        RETURN_IF_ERROR(checkpoint(step));
      }
      return absl::CancelledError(absl::StrCat("stopped after step ", step));
    }
    const Clock::time_point step_start = Clock::now();
    Clock::time_point data_end;
    data_->SampleWindows(batch, time + 1, &window_tokens);
    double loss_value = 0, grad_norm = 0;
    const double lr = LearningRate(step, options_);
    try {
      // Every rank sampled the same global batch; a data rank takes its rows.
      auto [inputs, targets] = rank_rows(window_tokens);
      data_end = Clock::now();
      RETURN_IF_ERROR(engine->Step(inputs, targets, static_cast<int>(micro_batches), lr, &loss_value, &grad_norm));
    } catch (const c10::OutOfMemoryError& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("step ", step + 1, ": ", engine->ExplainOutOfMemory(e.what_without_backtrace())));
    }
    if (!std::isfinite(loss_value)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "training diverged: the loss is %f at step %d; lower train.lr (now %g) or set "
          "train.grad_clip",
          loss_value, step + 1, options_.lr));
    }

    const Clock::time_point step_end = Clock::now();
    StepReport report;
    report.step = step + 1;
    report.total_steps = options_.steps;
    report.loss = loss_value;
    report.lr = lr;
    report.grad_norm = grad_norm;
    report.step_seconds = std::chrono::duration<double>(step_end - step_start).count();
    tokens_seen += batch * time;
    report.tokens = tokens_seen;
    report.tokens_per_second = report.step_seconds > 0 ? double(batch * time) / report.step_seconds : 0;
    report.elapsed_seconds = std::chrono::duration<double>(step_end - start).count();
    report.host_memory_bytes = ProcessResidentBytes();
    engine->Report(&report);
    report.times.data = Seconds(step_start, data_end);
    const uint64_t host_budget = engine_.memory.has_value() ? engine_.memory->host_budget_bytes : 0;
    report.capacity = {{"device", "", device->capacity_bytes()},
                       {"host", "", host_budget > 0 ? host_budget : HostMemoryTotalBytes()}};
    if (report.memory_stats.disk_chunks > 0) report.capacity.push_back({"disk", "", engine_.memory->disk_budget_bytes});
    if (engine_.eval_data != nullptr &&
        (step + 1 == options_.steps ||
         (options_.eval_every_steps > 0 && (step + 1) % options_.eval_every_steps == 0))) {
      ASSIGN_OR_RETURN(report.eval, evaluate(step + 1));
    }
    report.initial_eval = std::move(initial_eval);
    initial_eval.reset();
    observer_->OnStep(report);
    if (engine_.on_checkpoint && engine_.checkpoint_every_steps > 0 &&
        ((step + 1) % engine_.checkpoint_every_steps == 0 || step + 1 == options_.steps)) {
      RETURN_IF_ERROR(checkpoint(step + 1));
    }
  }
  return absl::OkStatus();
}

namespace {

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

class SilentObserver : public TrainingObserver {
 public:
  void OnStep(const StepReport&) override {}
};

// RestoreParameters' arguments, checked once for both forms.
absl::Status CheckRestoring(const MemoryDevice* device, int tensor_rank, int tensor_ranks) {
  if (device == nullptr) return absl::InvalidArgumentError("RestoreParameters: no device");
  if (tensor_ranks < 1 || tensor_rank < 0 || tensor_rank >= tensor_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("tensor rank ", tensor_rank, " of ", tensor_ranks));
  }
  return absl::OkStatus();
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
    named = (*engine)->NamedParameterValues();
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
