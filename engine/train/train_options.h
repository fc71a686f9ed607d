#pragma once

#include <cstdint>

namespace ferry {

// How to train. Every field is set by the caller (the worker fills them from
// the job spec, whose documentation gives the defaults).
struct TrainOptions {
  // Optimizer steps.
  int64_t steps = 100;
  // Sequences per step (optimizer update); each holds `ModelConfig::seq_len`
  // tokens.
  int64_t batch_size = 8;
  // Gradient accumulation: each step's batch runs as this many micro-batches
  // of batch_size / grad_accum_steps sequences (per data rank: of
  // batch_size / (grad_accum_steps * data ranks)), forward and backward one
  // after another with their gradients summed, then one update. The same
  // training as one pass over the whole batch (the same sampled windows and
  // dropout masks; the loss is the mean over the micro-batches), to float
  // rounding, with activations for one micro-batch only. Must divide the
  // batch (with the data ranks).
  int64_t grad_accum_steps = 1;
  // Peak learning rate, after `warmup_steps` of linear warm-up; a cosine
  // schedule then decays it to `min_lr` at the last step.
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 5;
  // AdamW.
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  // Clip the global gradient norm to this; 0 disables clipping.
  double grad_clip = 1.0;
  // Seeds initialisation and dropout (the data source has its own seed).
  uint64_t seed = 1;
  // Intra-op CPU threads; 0 leaves LibTorch's default.
  int threads = 0;
  // Weights, activations and gradients in fp32, or in fp16 / bf16 with fp32
  // master weights (mixed precision; the chunked engine only).
  enum class Precision { kFp32, kFp16, kBf16 };
  Precision precision = Precision::kFp32;
  // On the CPU, how bf16 matrix products compute. Natively: bf16 inputs,
  // fp32 accumulation (oneDNN's bf16 GEMM), each product rounded once to
  // bf16. Or in fp32 from the bf16 values, the result rounded to bf16: the
  // same rounding of the result, but the CPU's fp32 rate. Auto is native
  // where the CPU multiplies bf16 (AVX512-BF16, AMX), fp32 elsewhere. fp16
  // products always compute in fp32 on the CPU; devices with reduced-
  // precision kernels (CUDA) always compute natively.
  enum class CpuBf16Matmul { kAuto, kNative, kFp32 };
  CpuBf16Matmul cpu_bf16_matmul = CpuBf16Matmul::kAuto;
  // Chunks updated on the host are updated beside the next step's forward
  // (ChunkOptimizer), with the same weights as at the end of the step.
  bool overlap_optimizer = true;
  // Evaluation (with EngineOptions::eval_data): after every this many
  // steps, and after the last, the mean loss over `eval_batches` batches of
  // `batch_size` sequences, the same batches each time. 0: only after the
  // last step.
  int64_t eval_every_steps = 0;
  int64_t eval_batches = 4;
  // fp16: the initial loss scale and the clean steps before it grows.
  double loss_scale = 65536.0;
  int64_t loss_scale_growth_interval = 1000;
};

// Whether bf16 training's matrix products compute natively in bf16 on the
// CPU: as cpu_bf16_matmul says, auto where the CPU multiplies bf16. False
// for any other precision.
bool NativeCpuBf16Products(const TrainOptions& options);

}  // namespace ferry
