#include "engine/train/step_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/status_macros.h"

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

}  // namespace

std::unique_ptr<StepEngine> MakePlainEngine(Gpt model, const TrainOptions& options, MemoryDevice* device) {
  return std::make_unique<PlainEngine>(std::move(model), options, device);
}

absl::StatusOr<std::unique_ptr<ChunkedEngine>> ChunkedEngine::Create(Gpt model, const TrainOptions& train,
                                                                      MemoryOptions memory, MemoryDevice* device,
                                                                      ManagerGroups groups,
                                                                      TrainingObserver* observer) {
  std::unique_ptr<ChunkedEngine> e(new ChunkedEngine(std::move(model), train, device, groups, observer));
  RETURN_IF_ERROR(e->Init(std::move(memory)));
  return e;
}

absl::Status ChunkedEngine::Step(const torch::Tensor& inputs, const torch::Tensor& targets, int micro_batches,
                                 double lr, double* loss, double* grad_norm) {
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
    torch::Tensor l = Forward(micro.Rows(inputs, m), LossHead(micro_targets));
    loss_sum += l.item<double>();
    const Clock::time_point forward_end = Clock::now();
    (backward_scale != 1.0 ? l * backward_scale : l).backward();
    l = torch::Tensor();
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
  PlacementReport placement = manager_->Placement();
  placement.recomputed_blocks = BlocksOf(placement.recomputed_stages);
  observer_->OnPlacement(placement);
  return absl::OkStatus();
}

double ChunkedEngine::Evaluate(const torch::Tensor& inputs, const torch::Tensor& targets) {
  double loss = EvalForward(inputs, LossHead(targets)).item<double>();
  if (groups_.data != nullptr && groups_.data->size() > 1) {
    at::Tensor sum = at::full({1}, loss, at::kDouble);
    groups_.data->AllReduce(sum);
    loss = sum.item<double>() / groups_.data->size();
  }
  return loss;
}

void ChunkedEngine::Report(StepReport* report) {
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
  report->recomputed_blocks = BlocksOf(stats_.recomputed_stages);
}

std::string ChunkedEngine::ExplainOutOfMemory(const std::string& what) const {
  return manager_->ExplainOutOfMemory(what);
}

absl::Status ChunkedEngine::SaveState(const std::string& prefix, CheckpointContents* contents) {
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

absl::Status ChunkedEngine::RestoreState(const std::string& prefix, const CheckpointContents& contents) {
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

std::vector<int> ChunkedEngine::BlocksOf(const std::vector<int>& stages) const {
  std::vector<int> blocks;
  for (int stage : stages) blocks.push_back(static_cast<int>(stages_.BlockOf(stage)));
  return blocks;
}

at::Tensor ChunkedEngine::LastLogits(const torch::Tensor& tokens, KvCache* cache) {
  return EvalForward(tokens, LogitsHead(), cache);
}

ChunkedEngine::Head ChunkedEngine::LossHead(const torch::Tensor& targets) {
  GptImpl* gpt = model_.get();
  return {[gpt, targets](const at::Tensor& x) { return gpt->HeadLoss(x, targets); },
          [gpt](const at::Tensor& x) { return gpt->HeadNorm(x); },
          [gpt, targets](int k, const at::Tensor& normed) { return gpt->HeadPieceStats(k, normed, targets); },
          [gpt](const std::vector<at::Tensor>& stats) { return gpt->CombineHeadStats(stats); }};
}

ChunkedEngine::Head ChunkedEngine::LogitsHead() {
  GptImpl* gpt = model_.get();
  return {[gpt](const at::Tensor& x) { return gpt->LastLogits(x); },
          [gpt](const at::Tensor& x) { return gpt->HeadNorm(x.select(1, x.size(1) - 1)); },
          [gpt](int k, const at::Tensor& normed) { return gpt->PieceLogits(k, normed); },
          [](const std::vector<at::Tensor>& logits) { return at::cat(logits, -1); }};
}

at::Tensor ChunkedEngine::Forward(const torch::Tensor& tokens, const Head& head, KvCache* cache) {
  GptImpl* gpt = model_.get();
  const int64_t first = cache != nullptr ? cache->positions() : 0;
  if (cache != nullptr) cache->layers.resize(static_cast<size_t>(gpt->block_count()));
  torch::Tensor x = manager_->RunStage(stages_.embed(0), tokens,
                                       [&](const torch::Tensor& t) { return gpt->EmbedPiece(0, t, {}, first); });
  for (int k = 1; k < stages_.pieces; ++k) {
    x = manager_->RunStage(stages_.embed(k), x,
                           [&](const torch::Tensor& t) { return gpt->EmbedPiece(k, tokens, t, first); });
  }
  for (int64_t i = 0; i < gpt->block_count(); ++i) {
    // By value: a recomputing block runs this again in the backward.
    KvCacheLayer* layer = cache != nullptr ? &cache->layers[static_cast<size_t>(i)] : nullptr;
    x = manager_->RunStage(stages_.block(i), x,
                           [gpt, i, layer](const torch::Tensor& t) { return gpt->block(i).forward(t, layer); });
  }
  if (stages_.pieces == 1) return manager_->RunStage(stages_.head(), x, head.whole);
  const torch::Tensor normed = manager_->RunStage(stages_.head(), x, head.norm);
  x = torch::Tensor();
  std::vector<at::Tensor> parts;
  for (int k = 0; k < stages_.pieces; ++k) {
    parts.push_back(
        manager_->RunStage(stages_.head_piece(k), normed, [&](const torch::Tensor& t) { return head.piece(k, t); }));
  }
  return head.combine(parts);
}

at::Tensor ChunkedEngine::EvalForward(const torch::Tensor& tokens, const Head& head, KvCache* cache) {
  GptImpl& gpt = *model_;
  gpt.eval();
  manager_->BeginEval();
  auto train_again = absl::MakeCleanup([&] {
    manager_->EndEval();
    gpt.train();
  });
  return Forward(tokens, head, cache);
}

std::vector<std::pair<std::string, at::Tensor>> ChunkedEngine::NamedParameterValues() const {
  const std::vector<at::Tensor> values = manager_->ParameterValues();
  std::vector<std::pair<std::string, at::Tensor>> named;
  size_t i = 0;
  for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), values.at(i++));
  return named;
}

ChunkedEngine::ChunkedEngine(Gpt model, const TrainOptions& train, MemoryDevice* device, ManagerGroups groups,
                             TrainingObserver* observer)
    : model_(std::move(model)),
      stages_(StagesOf(model_->config(), model_->tensor_group().size())),
      train_(train),
      device_(device),
      groups_(groups),
      observer_(observer) {}

absl::Status ChunkedEngine::Init(MemoryOptions memory) {
  memory.micro_batches = static_cast<int>(train_.grad_accum_steps);
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
  // Stages as the model's shapes say (ModelStages: the embeddings, each
  // block, the head); a tied output layer is the embedding's weight, used by
  // both.
  const int tensor_ranks = model_->tensor_group().size();
  std::vector<StageParams> stages;
  for (int s = 0; s < stages_.count(); ++s) {
    stages.push_back({stages_.Name(s), {}, /*recomputable=*/stages_.BlockOf(s) >= 0});
  }
  const std::vector<ParameterShape> shapes = ModelParameterShapes(model_->config(), tensor_ranks);
  const std::vector<std::vector<int>> uses = ModelStageParameters(model_->config(), shapes, tensor_ranks);
  for (size_t s = 0; s < uses.size(); ++s) {
    for (int i : uses[s]) stages.at(s).params.push_back(index.at(shapes[static_cast<size_t>(i)].name));
  }
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
  mode.upcast = device_->compute_device().is_cpu() && !(mode.dtype == at::kBFloat16 && NativeCpuBf16Products(train_));
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

}  // namespace ferry
