#include "server/spec/spec_defaults.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/model_files.h"

namespace ferry {

using ferry::v1::JobSpec;

absl::StatusOr<JobSpec> WithDefaults(const JobSpec& spec) {
  JobSpec out = spec;

  ferry::v1::ModelSpec* model = out.mutable_model();
  // Preset names are short; a long value is not echoed back whole.
  constexpr size_t kMaxPresetLength = 64;
  if (model->preset().size() > kMaxPresetLength) {
    return absl::InvalidArgumentError(absl::StrCat("model.preset: ", model->preset().size(),
                                                   " characters is not a preset name; use one such as "
                                                   "gpt2-small (at most ",
                                                   kMaxPresetLength, " characters)"));
  }
  const std::string base = model->preset().empty() ? "gpt2-tiny" : model->preset();
  absl::StatusOr<ModelConfig> preset = ModelPreset(base);
  if (!preset.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model.preset: ", preset.status().message()));
  }
  const bool no_architecture = model->preset().empty() && model->layers() == 0 && model->hidden() == 0 &&
                               model->heads() == 0 && model->vocab_size() == 0 && model->seq_len() == 0;
  if (!model->init_from().empty() && model->preset().empty()) {
    // The architecture fields left unset are read from the weights file or
    // the model folder's config.json (ResolveModelFromWeights, where they
    // can be read); only dropout has a default here: GPT-2's for a GPT-2
    // file, none for a model folder (the Llama family fine-tunes without).
    if (!model->has_dropout()) model->set_dropout(ModelFiles::IsFolder(model->init_from()) ? 0.0 : 0.1);
  } else {
    if (no_architecture) model->set_preset(base);
    // A preset's architecture, unless the job file names another family.
    if (!model->has_architecture() || model->architecture().model_type().empty() ||
        model->architecture().model_type() == preset->model_type) {
      SetModelArchitecture(*preset, model);
    }
    if (!model->has_dropout()) model->set_dropout(preset->dropout);
  }

  if (out.data().has_synthetic()) {
    ferry::v1::SyntheticData* synthetic = out.mutable_data()->mutable_synthetic();
    if (synthetic->branching() == 0) synthetic->set_branching(2);
    if (synthetic->seed() == 0) synthetic->set_seed(1);
  }

  ferry::v1::TrainSpec* train = out.mutable_train();
  if (train->steps() == 0) train->set_steps(100);
  if (train->batch_size() == 0) train->set_batch_size(8);
  if (train->grad_accum_steps() == 0) train->set_grad_accum_steps(1);
  if (train->lr() == 0) train->set_lr(3e-4);
  if (!train->has_warmup_steps()) {
    train->set_warmup_steps(std::min<uint64_t>(100, train->steps() / 20));
  }
  if (!train->has_min_lr()) train->set_min_lr(train->lr() / 10);
  if (!train->has_weight_decay()) train->set_weight_decay(0.1);
  if (!train->has_grad_clip()) train->set_grad_clip(1.0);
  if (train->seed() == 0) train->set_seed(1);
  if (train->precision() == ferry::v1::PRECISION_UNSPECIFIED) {
    train->set_precision(ferry::v1::PRECISION_FP32);
  }
  if (train->cpu_bf16_matmul() == ferry::v1::CPU_BF16_MATMUL_UNSPECIFIED) {
    train->set_cpu_bf16_matmul(ferry::v1::CPU_BF16_MATMUL_AUTO);
  }
  if (!train->has_overlap_optimizer()) train->set_overlap_optimizer(true);
  if (train->eval_every_steps() == 0 && out.data().has_eval()) {
    train->set_eval_every_steps(std::max<uint64_t>(1, train->steps() / 10));
  }
  if (train->eval_batches() == 0) train->set_eval_batches(4);
  if (!train->has_beta1()) train->set_beta1(0.9);
  if (!train->has_beta2()) train->set_beta2(0.95);
  if (!train->has_eps()) train->set_eps(1e-8);
  if (!train->has_loss_scale()) train->set_loss_scale(65536.0);
  if (train->loss_scale_growth_interval() == 0) train->set_loss_scale_growth_interval(1000);

  ferry::v1::MemorySpec* memory = out.mutable_memory();
  if (memory->policy() == ferry::v1::MEMORY_POLICY_UNSPECIFIED) {
    memory->set_policy(ferry::v1::MEMORY_POLICY_AUTO);
  }
  const MemoryOptions engine_defaults;
  if (!memory->has_static_param_host_fraction()) {
    memory->set_static_param_host_fraction(engine_defaults.static_param_host_fraction);
  }
  if (!memory->has_static_optimizer_host_fraction()) {
    memory->set_static_optimizer_host_fraction(engine_defaults.static_optimizer_host_fraction);
  }
  if (!memory->has_margin()) memory->set_margin(engine_defaults.margin);
  if (!memory->has_prefetch()) memory->set_prefetch(engine_defaults.prefetch);
  if (memory->recompute_every() != 0 && memory->recompute() != ferry::v1::RECOMPUTE_MODE_EVERY) {
    // recompute_every alone asks for every k-th block; beside another mode
    // it would be ignored, so say so.
    if (memory->recompute() != ferry::v1::RECOMPUTE_MODE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          "memory.recompute_every: applies only with memory.recompute: every; set that or remove "
          "memory.recompute_every");
    }
    memory->set_recompute(ferry::v1::RECOMPUTE_MODE_EVERY);
  }
  if (memory->recompute() == ferry::v1::RECOMPUTE_MODE_UNSPECIFIED) {
    memory->set_recompute(ferry::v1::RECOMPUTE_MODE_AUTO);
  }
  if (memory->recompute() == ferry::v1::RECOMPUTE_MODE_EVERY && memory->recompute_every() == 0) {
    memory->set_recompute_every(static_cast<uint32_t>(engine_defaults.recompute_every));
  }

  ferry::v1::ParallelSpec* parallel = out.mutable_parallel();
  if (parallel->tensor() == 0) parallel->set_tensor(1);
  if (parallel->data() == 0) parallel->set_data(1);
  if (parallel->shard() == ferry::v1::SHARD_MODE_UNSPECIFIED) {
    parallel->set_shard(parallel->data() > 1 ? ferry::v1::SHARD_MODE_OPTIMIZER : ferry::v1::SHARD_MODE_NONE);
  }

  if (!out.checkpoint().dir().empty()) {
    ferry::v1::CheckpointSpec* checkpoint = out.mutable_checkpoint();
    if (checkpoint->every_steps() == 0) checkpoint->set_every_steps(100);
    if (checkpoint->keep() == 0) checkpoint->set_keep(2);
    if (checkpoint->on_error() == ferry::v1::CHECKPOINT_ON_ERROR_UNSPECIFIED) {
      checkpoint->set_on_error(ferry::v1::CHECKPOINT_ON_ERROR_CONTINUE);
    }
  }
  return out;
}

void SetModelArchitecture(const ModelConfig& c, ferry::v1::ModelSpec* model) {
  auto fill = [](uint32_t value, int64_t from) {
    return value != 0 ? value : static_cast<uint32_t>(std::min<int64_t>(from, UINT32_MAX));
  };
  model->set_layers(fill(model->layers(), c.layers));
  model->set_hidden(fill(model->hidden(), c.hidden));
  model->set_heads(fill(model->heads(), c.heads));
  model->set_vocab_size(fill(model->vocab_size(), c.vocab_size));
  model->set_seq_len(fill(model->seq_len(), c.seq_len));
  // GPT-2's is the default architecture, recorded by no message (so GPT-2
  // jobs' specs, and their checkpoints' fingerprints, are what they were).
  if (c.model_type == "gpt2" && !model->has_architecture()) return;
  // The job file's own architecture fields win too; a bool cannot say it
  // was set, so `untied` is the config's unless the file named the family.
  ferry::v1::ModelArchitecture* a = model->mutable_architecture();
  const bool named = !a->model_type().empty();
  auto fill_u = [&](uint32_t value, int64_t from) { return value != 0 ? value : fill(0, from); };
  auto fill_d = [](double value, double from) { return value != 0 ? value : from; };
  if (!named) a->set_model_type(c.model_type);
  a->set_kv_heads(fill_u(a->kv_heads(), c.kv_heads));
  a->set_head_dim(fill_u(a->head_dim(), c.head_dim));
  a->set_intermediate(fill_u(a->intermediate(), c.intermediate));
  a->set_norm_eps(fill_d(a->norm_eps(), c.norm_eps));
  a->set_rope_theta(fill_d(a->rope_theta(), c.rope_theta));
  const RopeScaling& r = c.rope_scaling;
  if (a->rope_scaling().empty() && r.type != RopeScaling::Type::kNone) {
    a->set_rope_scaling(r.type == RopeScaling::Type::kLinear ? "linear" : "llama3");
    a->set_rope_factor(fill_d(a->rope_factor(), r.factor));
    a->set_rope_low_freq_factor(fill_d(a->rope_low_freq_factor(), r.low_freq_factor));
    a->set_rope_high_freq_factor(fill_d(a->rope_high_freq_factor(), r.high_freq_factor));
    a->set_rope_original_max_positions(fill_u(a->rope_original_max_positions(), r.original_max_positions));
  }
  if (!named) a->set_untied(!c.tied);
  a->set_max_positions(fill_u(a->max_positions(), c.max_positions));
}

ModelConfig ToModelConfig(const ferry::v1::ModelSpec& model) {
  const ferry::v1::ModelArchitecture& a = model.architecture();
  // An unknown type is the validator's to refuse; GPT-2's meanwhile.
  ModelConfig c = ModelFamily(a.model_type().empty() ? "gpt2" : a.model_type()).value_or(ModelConfig{});
  c.kv_heads = a.kv_heads();
  c.head_dim = a.head_dim();
  c.intermediate = a.intermediate();
  if (a.norm_eps() > 0) c.norm_eps = a.norm_eps();
  if (a.rope_theta() > 0) c.rope_theta = a.rope_theta();
  if (a.rope_scaling() == "linear" || a.rope_scaling() == "llama3") {
    c.rope_scaling.type = a.rope_scaling() == "linear" ? RopeScaling::Type::kLinear : RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = a.rope_factor();
    c.rope_scaling.low_freq_factor = a.rope_low_freq_factor();
    c.rope_scaling.high_freq_factor = a.rope_high_freq_factor();
    c.rope_scaling.original_max_positions = a.rope_original_max_positions();
  }
  c.tied = !a.untied();
  c.max_positions = a.max_positions();
  c.layers = model.layers();
  c.hidden = model.hidden();
  c.heads = model.heads();
  c.vocab_size = model.vocab_size();
  c.seq_len = model.seq_len();
  c.dropout = model.dropout();
  return c;
}

TrainOptions ToTrainOptions(const ferry::v1::TrainSpec& train) {
  TrainOptions o;
  o.steps = static_cast<int64_t>(train.steps());
  o.batch_size = train.batch_size();
  o.grad_accum_steps = train.grad_accum_steps();
  o.lr = train.lr();
  o.min_lr = train.min_lr();
  o.warmup_steps = static_cast<int64_t>(train.warmup_steps());
  o.weight_decay = train.weight_decay();
  o.beta1 = train.beta1();
  o.beta2 = train.beta2();
  o.eps = train.eps();
  o.grad_clip = train.grad_clip();
  o.seed = train.seed();
  o.threads = static_cast<int>(train.threads());
  switch (train.precision()) {
    case ferry::v1::PRECISION_FP16:
      o.precision = TrainOptions::Precision::kFp16;
      break;
    case ferry::v1::PRECISION_BF16:
      o.precision = TrainOptions::Precision::kBf16;
      break;
    default:
      o.precision = TrainOptions::Precision::kFp32;
  }
  o.overlap_optimizer = train.overlap_optimizer();
  o.eval_every_steps = static_cast<int64_t>(train.eval_every_steps());
  o.eval_batches = train.eval_batches();
  o.loss_scale = train.loss_scale();
  o.loss_scale_growth_interval = train.loss_scale_growth_interval();
  switch (train.cpu_bf16_matmul()) {
    case ferry::v1::CPU_BF16_MATMUL_NATIVE:
      o.cpu_bf16_matmul = TrainOptions::CpuBf16Matmul::kNative;
      break;
    case ferry::v1::CPU_BF16_MATMUL_FP32:
      o.cpu_bf16_matmul = TrainOptions::CpuBf16Matmul::kFp32;
      break;
    default:
      o.cpu_bf16_matmul = TrainOptions::CpuBf16Matmul::kAuto;
  }
  return o;
}

MemoryOptions ToMemoryOptions(const ferry::v1::MemorySpec& memory) {
  MemoryOptions o;
  o.policy = memory.policy() == ferry::v1::MEMORY_POLICY_STATIC ? MemoryOptions::Policy::kStatic
                                                                : MemoryOptions::Policy::kAuto;
  o.host_budget_bytes = memory.host_budget();
  // The worker puts the job's own directory inside disk_dir here (and its
  // default when unset), and the budget it derives when unset.
  o.disk_dir = memory.disk_dir();
  o.disk_budget_bytes = memory.disk_budget();
  o.chunk_elements = static_cast<int64_t>(memory.chunk_size() / sizeof(float));
  o.static_param_host_fraction = memory.static_param_host_fraction();
  o.static_optimizer_host_fraction = memory.static_optimizer_host_fraction();
  o.margin = memory.margin();
  o.prefetch = memory.prefetch();
  switch (memory.recompute()) {
    case ferry::v1::RECOMPUTE_MODE_NONE:
      o.recompute = MemoryOptions::Recompute::kNone;
      break;
    case ferry::v1::RECOMPUTE_MODE_ALL:
      o.recompute = MemoryOptions::Recompute::kAll;
      break;
    case ferry::v1::RECOMPUTE_MODE_EVERY:
      o.recompute = MemoryOptions::Recompute::kEvery;
      break;
    default:
      o.recompute = MemoryOptions::Recompute::kAuto;
  }
  o.recompute_every = static_cast<int>(memory.recompute_every());
  return o;
}

MemoryOptions ToMemoryOptions(const ferry::v1::JobSpec& spec) {
  MemoryOptions o = ToMemoryOptions(spec.memory());
  if (spec.parallel().data() > 1 && spec.parallel().shard() == ferry::v1::SHARD_MODE_OPTIMIZER) {
    o.shard = MemoryOptions::Shard::kOptimizer;
  } else if (spec.parallel().data() > 1 && spec.parallel().shard() == ferry::v1::SHARD_MODE_FULL) {
    o.shard = MemoryOptions::Shard::kFull;
  }
  return o;
}

}  // namespace ferry
