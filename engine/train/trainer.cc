#include "engine/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/cpu_generator.h"
#include "engine/common/host_info.h"
#include "engine/common/status_macros.h"
#include "engine/common/torch_status.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/gpt.h"
#include "engine/train/hf_import.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/step_engine.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
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
    engine = MakePlainEngine(std::move(model), options_, device);
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

}  // namespace ferry
