#include "engine/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/host_info.h"
#include "engine/common/torch_status.h"
#include "engine/device/device.h"
#include "engine/model/gpt.h"
#include "engine/train/lr_schedule.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t TensorBytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
}

// Parameters (and their names) split into those AdamW decays — matrices and
// embedding tables — and the rest: biases and LayerNorm gains.
std::vector<torch::optim::OptimizerParamGroup> ParamGroups(torch::nn::Module& model,
                                                           const TrainOptions& options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto adamw = [&](double weight_decay) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(options.lr);
    o->betas({options.beta1, options.beta2}).eps(options.eps).weight_decay(weight_decay);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(options.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  return groups;
}

}  // namespace

Trainer::Trainer(GptConfig model, TrainOptions options, std::unique_ptr<TokenSource> data,
                 c10::Device device, TrainingObserver* observer)
    : model_config_(model),
      options_(options),
      data_(std::move(data)),
      device_(device),
      observer_(observer) {}

absl::Status Trainer::Run() {
  return CallTorch("training", [&]() -> absl::Status {
    if (options_.threads > 0) torch::set_num_threads(options_.threads);
    torch::manual_seed(options_.seed);

    Gpt model(model_config_);
    model->to(device_);
    model->train();
    const std::vector<torch::Tensor> params = model->parameters();
    torch::optim::AdamW optimizer(ParamGroups(*model, options_),
                                  torch::optim::AdamWOptions(options_.lr));

    observer_->OnStarted({device_.str(), model_config_.ParameterCount(), options_.steps});

    const int64_t batch = options_.batch_size;
    const int64_t time = model_config_.seq_len;
    const double max_norm =
        options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
    std::vector<int64_t> window_tokens;
    int64_t tokens_seen = 0;
    const Clock::time_point start = Clock::now();

    for (int64_t step = 0; step < options_.steps; ++step) {
      if (observer_->StopRequested()) {
        return absl::CancelledError(absl::StrCat("stopped after step ", step));
      }
      const Clock::time_point step_start = Clock::now();

      data_->SampleWindows(batch, time + 1, &window_tokens);
      torch::Tensor windows =
          torch::from_blob(window_tokens.data(), {batch, time + 1}, torch::kLong).to(device_, /*non_blocking=*/false, /*copy=*/true);
      torch::Tensor inputs = windows.slice(1, 0, time);
      torch::Tensor targets = windows.slice(1, 1, time + 1);

      const double lr = LearningRate(step, options_);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }

      optimizer.zero_grad();
      torch::Tensor loss = GptImpl::Loss(model->forward(inputs), targets);
      loss.backward();
      const double grad_norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
      optimizer.step();

      const double loss_value = loss.item<double>();
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
      report.tokens_per_second =
          report.step_seconds > 0 ? double(batch * time) / report.step_seconds : 0;
      report.elapsed_seconds = std::chrono::duration<double>(step_end - start).count();

      uint64_t param_bytes = 0, grad_bytes = 0, state_bytes = 0;
      for (const torch::Tensor& p : params) {
        param_bytes += TensorBytes(p);
        grad_bytes += TensorBytes(p.grad());
      }
      for (const auto& entry : optimizer.state()) {
        const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
        state_bytes += TensorBytes(state.exp_avg()) + TensorBytes(state.exp_avg_sq());
      }
      const std::string tier = device_.is_cpu() ? "host" : "device";
      const uint64_t rss = ProcessResidentBytes();
      report.host_memory_bytes = rss;
      report.device_memory_bytes = DeviceMemoryAllocatedBytes(device_);
      report.memory = {{tier, "params", param_bytes},
                       {tier, "grads", grad_bytes},
                       {tier, "optimizer_states", state_bytes}};
      const uint64_t model_bytes = param_bytes + grad_bytes + state_bytes;
      const uint64_t tier_in_use = device_.is_cpu() ? rss : report.device_memory_bytes;
      report.memory.push_back(
          {tier, "non_model", tier_in_use > model_bytes ? tier_in_use - model_bytes : 0});
      report.capacity = {{"host", "", HostMemoryTotalBytes()}};
      if (!device_.is_cpu()) report.capacity.push_back({"device", "", DeviceMemoryTotalBytes(device_)});
      observer_->OnStep(report);
    }
    return absl::OkStatus();
  });
}

}  // namespace ferry
