// Throughput at scale: how close a training step comes to the machine's
// matrix-product rate. In one run: the GEMM rate in fp32 and bf16 (the
// probe ferryd reports), then gpt2-small in fp32 with an ample device and
// the same job in the plain LibTorch loop, gpt2-small in bf16 with a 256 MiB
// device budget, and gpt2-large (774 M) in bf16 with 1 GiB; the bf16 jobs
// twice, with the CPU's bf16 matrix products native and computed in fp32
// (what every CPU did before), side by side, and gpt2-large once more with
// the optimizer at the step's end instead of beside the next forward. Per run: tokens a second, the
// median step after the warm-up, the achieved model FLOP/s (6 x parameters
// x tokens a step; recomputation and attention scores not counted) and its
// share of the GEMM rate of the job's type, and where a step went.
//
// Beside each run, its floor: the two parts of its step that no schedule
// hides when the device is the host's own cores, each timed alone at the
// job's sizes in the same run. They are the step's matrix products at its
// shapes (batch x seq tokens against every weight, forward and backward)
// and the optimizer's update of every parameter (the CPU kernel, in the
// job's types). Both share the cores with everything else, so a step can
// be no shorter than their sum; elementwise work, the attention scores and
// the simulated device's copies come on top. Also per run: the bytes a
// steady step moved between host and device, and how long the copy
// engines were busy with them.
//
//   bazel run -c opt //bench:scale [-- --quick] [--steps=N]
//
// --quick (under three minutes) runs smaller models. Writes
// bench/results/scale.json (scale_quick.json with --quick) and prints a
// table. Figures only; nothing here passes or fails on a time.

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_output.h"
#include "bench/sim_trial.h"
#include "bench/floor.h"
#include "bench/timing.h"
#include "engine/common/host_info.h"
#include "engine/device/device.h"
#include "engine/model/model_config.h"

ABSL_FLAG(bool, quick, false, "Smaller models (under three minutes).");
ABSL_FLAG(int64_t, steps, 4, "Steps a run, the warm-up included.");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/scale.json).");
ABSL_FLAG(std::string, only, "", "Run only the job of this name (for profiling it).");
ABSL_FLAG(std::string, trace, "", "Record LibTorch's operators in each job to FILE.N.json (chrome://tracing).");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string FormatMiB(uint64_t bytes) {
  return bytes % (1024 * kMiB) == 0 ? absl::StrCat(bytes / (1024 * kMiB), " GiB") : absl::StrCat(bytes / kMiB, " MiB");
}

struct Job {
  std::string name;
  std::string preset;
  int64_t seq_len;
  int64_t batch;
  TrainOptions::Precision precision;
  uint64_t device_bytes;
  bool chunked;  // false: the plain LibTorch loop
  TrainOptions::CpuBf16Matmul bf16_matmul = TrainOptions::CpuBf16Matmul::kAuto;
  bool overlap_optimizer = true;
};

struct Result {
  Job job;
  std::string error;
  int64_t parameters = 0;
  std::vector<double> losses, seconds;
  double step_seconds = 0, tokens_per_second = 0, achieved_flops = 0, fraction_of_gemm = 0;
  StepSplit split;
  // Medians over the steady steps.
  double moved_bytes = 0, copy_seconds = 0;
  // The floor (above): products and update, each alone.
  double floor_products = 0, floor_update = 0;
};

Result RunJob(const Job& job) {
  Result result;
  result.job = job;
  ModelConfig model = *ModelPreset(job.preset);
  model.seq_len = job.seq_len;
  result.parameters = model.ParameterCount();
  SimulatedDevice device(job.device_bytes);
  TrainOptions train;
  train.steps = absl::GetFlag(FLAGS_steps);
  train.batch_size = job.batch;
  train.lr = 1e-4;
  train.min_lr = 1e-5;
  train.warmup_steps = 1;
  train.threads = HostCpuCount();
  train.precision = job.precision;
  train.cpu_bf16_matmul = job.bf16_matmul;
  train.overlap_optimizer = job.overlap_optimizer;
  EngineOptions engine;
  engine.device = &device;
  if (job.chunked) {
    MemoryOptions memory;
    memory.recompute = MemoryOptions::Recompute::kAuto;
    engine.memory = memory;
  }
  Collector observer;
  const absl::Status status =
      Trainer(model, train, engine, std::make_unique<SyntheticSource>(model.vocab_size, 2, 1, 1), &observer).Run();
  if (!status.ok()) result.error = std::string(status.message());
  const std::vector<StepReport>& r = observer.reports;
  std::vector<double> compute, optimizer, disk, transfer, moved, copies;
  for (size_t i = 0; i < r.size(); ++i) {
    result.losses.push_back(r[i].loss);
    if (i == 0) continue;  // the warm-up
    result.seconds.push_back(r[i].step_seconds);
    const StepSplit s = SplitOf(r[i]);
    compute.push_back(s.compute);
    optimizer.push_back(s.optimizer);
    disk.push_back(s.exposed_disk);
    transfer.push_back(s.exposed_transfer);
    const StepMemoryStats& m = r[i].memory_stats;
    moved.push_back(double(m.host_to_device_bytes + m.device_to_host_bytes));
    copies.push_back(m.copy_seconds);
  }
  result.step_seconds = Median(result.seconds);
  result.split = {Median(compute), Median(optimizer), Median(disk), Median(transfer)};
  result.moved_bytes = Median(moved);
  result.copy_seconds = Median(copies);
  if (result.step_seconds > 0) {
    const double step_tokens = double(job.batch * job.seq_len);
    result.tokens_per_second = step_tokens / result.step_seconds;
    result.achieved_flops = 6.0 * double(result.parameters) * result.tokens_per_second;
  }
  return result;
}

// Whether the job's bf16 products run in bf16 (rather than in fp32).
bool NativeBf16(const Job& job) {
  TrainOptions options;
  options.precision = job.precision;
  options.cpu_bf16_matmul = job.bf16_matmul;
  return NativeCpuBf16Products(options);
}

const char* MatmulName(const Job& job) {
  if (job.precision != TrainOptions::Precision::kBf16) return "fp32";
  return NativeBf16(job) ? "bf16 native" : "bf16 in fp32";
}

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  at::set_num_threads(HostCpuCount());
  // The rate a shared machine gives varies from minute to minute: the
  // probe runs before the jobs and again after them, and the higher of the
  // two is the rate the jobs are set against (the machine's, not a slow
  // minute's).
  std::fprintf(stderr, "scale: measuring the GEMM rate (1024^3 products, %d threads)\n", HostCpuCount());
  const double fp32_before = MeasureMatmulFlops(c10::Device(c10::kCPU), at::kFloat, 1024, 1.0);
  const double bf16_before = MeasureMatmulFlops(c10::Device(c10::kCPU), at::kBFloat16, 1024, 1.0);

  using P = TrainOptions::Precision;
  using M = TrainOptions::CpuBf16Matmul;
  const std::string small = quick ? "gpt2-mini" : "gpt2-small";
  const std::string large = quick ? "gpt2-mini" : "gpt2-large";
  const int64_t small_seq = quick ? 128 : 256;
  const int64_t large_seq = 128;
  const uint64_t small_budget = quick ? 16 * kMiB : 256 * kMiB;
  const uint64_t large_budget = quick ? 12 * kMiB : 1024 * kMiB;
  const uint64_t ample = HostMemoryTotalBytes() / 2;
  const std::vector<Job> jobs = {
      {small + " fp32, ample device", small, small_seq, 2, P::kFp32, ample, true},
      {small + " fp32, plain LibTorch loop", small, small_seq, 2, P::kFp32, ample, false},
      {small + " bf16, " + FormatMiB(small_budget), small, small_seq, 2, P::kBf16, small_budget, true, M::kAuto},
      {small + " bf16, " + FormatMiB(small_budget) + ", products in fp32", small, small_seq, 2, P::kBf16,
       small_budget, true, M::kFp32},
      {large + " bf16, " + FormatMiB(large_budget), large, large_seq, 1, P::kBf16, large_budget, true, M::kAuto},
      {large + " bf16, " + FormatMiB(large_budget) + ", products in fp32", large, large_seq, 1, P::kBf16,
       large_budget, true, M::kFp32},
      {large + " bf16, " + FormatMiB(large_budget) + ", optimizer at the step's end", large, large_seq, 1, P::kBf16,
       large_budget, true, M::kAuto, /*overlap_optimizer=*/false},
  };
  std::vector<Result> results;
  for (const Job& job : jobs) {
    if (!absl::GetFlag(FLAGS_only).empty() && job.name != absl::GetFlag(FLAGS_only)) continue;
    std::fprintf(stderr, "scale: %s (%lld steps)\n", job.name.c_str(),
                 static_cast<long long>(absl::GetFlag(FLAGS_steps)));
    if (!absl::GetFlag(FLAGS_trace).empty()) {
      torch::autograd::profiler::RecordProfile trace(absl::StrCat(absl::GetFlag(FLAGS_trace), ".", results.size(), ".json"));
      results.push_back(RunJob(job));
    } else {
      results.push_back(RunJob(job));
    }
    if (!results.back().error.empty()) std::fprintf(stderr, "  failed: %s\n", results.back().error.c_str());
    // The floor, once the job's simulated device is gone (its memory is the
    // host's again).
    Result& r = results.back();
    ModelConfig model = *ModelPreset(job.preset);
    model.seq_len = job.seq_len;
    r.floor_products = StepProductSeconds(model, job.batch * job.seq_len, NativeBf16(job) ? at::kBFloat16 : at::kFloat);
    r.floor_update = UpdateSeconds(r.parameters, job.precision == TrainOptions::Precision::kBf16);
  }
  std::fprintf(stderr, "scale: measuring the GEMM rate again\n");
  const double fp32_after = MeasureMatmulFlops(c10::Device(c10::kCPU), at::kFloat, 1024, 1.0);
  const double bf16_after = MeasureMatmulFlops(c10::Device(c10::kCPU), at::kBFloat16, 1024, 1.0);
  const double gemm_fp32 = std::max(fp32_before, fp32_after);
  const double gemm_bf16 = std::max(bf16_before, bf16_after);
  for (Result& r : results) {
    const double gemm = r.job.precision == P::kBf16 ? gemm_bf16 : gemm_fp32;
    r.fraction_of_gemm = gemm > 0 ? r.achieved_flops / gemm : 0;
  }

  std::printf("\nGEMM rate, %d threads: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s (%.2fx; before the jobs %.1f / %.1f, "
              "after %.1f / %.1f); bf16 arithmetic: %s\n\n",
              HostCpuCount(), gemm_fp32 / 1e9, gemm_bf16 / 1e9, gemm_bf16 / gemm_fp32, fp32_before / 1e9,
              bf16_before / 1e9, fp32_after / 1e9, bf16_after / 1e9, CpuHasBf16Arithmetic() ? "yes" : "no");
  std::printf("%-46s %-13s %9s %9s %10s %7s  %s\n", "run", "products", "s/step", "tok/s", "GFLOP/s", "of GEMM",
              "compute / optimizer / disk / transfer (s)");
  std::vector<std::string> rows;
  for (const Result& r : results) {
    std::printf("%-46s %-13s %9.3f %9.1f %10.1f %6.1f%%  %.2f / %.2f / %.2f / %.2f%s\n", r.job.name.c_str(),
                MatmulName(r.job), r.step_seconds, r.tokens_per_second, r.achieved_flops / 1e9,
                100 * r.fraction_of_gemm, r.split.compute, r.split.optimizer, r.split.exposed_disk,
                r.split.exposed_transfer, r.error.empty() ? "" : "  FAILED");
    rows.push_back(absl::StrCat(
        "    {\"name\": ", JsonString(r.job.name), ", \"preset\": \"", r.job.preset, "\", \"seq_len\": ",
        r.job.seq_len, ", \"batch\": ", r.job.batch, ", \"parameters\": ", r.parameters,
        ", \"device_budget_bytes\": ", r.job.device_bytes, ", \"chunked\": ", r.job.chunked ? "true" : "false",
        ", \"products\": \"", MatmulName(r.job), "\", \"overlap_optimizer\": ",
        r.job.overlap_optimizer ? "true" : "false", ", \"error\": ", JsonString(r.error),
        ",\n     \"losses\": ", JsonList(r.losses), ", \"step_seconds_all\": ", JsonList(r.seconds),
        absl::StrFormat(",\n     \"step_seconds\": %.4f, \"tokens_per_second\": %.2f, \"achieved_flops\": %.4g, "
                        "\"fraction_of_gemm\": %.4f,\n     \"step_split\": {\"compute\": %.3f, \"optimizer\": %.3f, "
                        "\"exposed_disk\": %.3f, \"exposed_transfer\": %.3f}",
                        r.step_seconds, r.tokens_per_second, r.achieved_flops, r.fraction_of_gemm, r.split.compute,
                        r.split.optimizer, r.split.exposed_disk, r.split.exposed_transfer),
        absl::StrFormat(",\n     \"floor_seconds\": {\"products\": %.3f, \"update\": %.3f}, \"moved_bytes\": %.4g, "
                        "\"copy_seconds\": %.3f}",
                        r.floor_products, r.floor_update, r.moved_bytes, r.copy_seconds)));
  }
  std::printf("\n%-46s %9s %9s %9s %11s %12s %12s\n", "floor: each part alone, this run (s)", "products", "update",
              "sum", "step/floor", "moved/step", "copies busy");
  for (const Result& r : results) {
    const double floor = r.floor_products + r.floor_update;
    std::printf("%-46s %9.3f %9.3f %9.3f %10.2fx %9.2f GB %10.3f s\n", r.job.name.c_str(), r.floor_products,
                r.floor_update, floor, floor > 0 ? r.step_seconds / floor : 0.0, r.moved_bytes / 1e9, r.copy_seconds);
  }
  // The same job with the two kinds of bf16 products, and with the
  // optimizer overlapped or at the step's end, in this run.
  std::vector<std::string> speedups, overlap;
  for (const Result& a : results) {
    for (const Result& b : results) {
      if (a.job.preset != b.job.preset || a.job.precision != b.job.precision ||
          a.job.device_bytes != b.job.device_bytes || a.step_seconds <= 0 || b.step_seconds <= 0 ||
          !a.job.overlap_optimizer || a.job.bf16_matmul != M::kAuto) {
        continue;
      }
      const double ratio = b.step_seconds / a.step_seconds;
      if (a.job.precision == P::kBf16 && b.job.bf16_matmul == M::kFp32) {
        std::printf("%s: %.2fx the step rate of fp32 products\n", a.job.name.c_str(), ratio);
        speedups.push_back(absl::StrFormat("%s: %.3f", JsonString(a.job.name), ratio));
      } else if (!b.job.overlap_optimizer) {
        std::printf("%s: %.2fx the step rate with the optimizer at the step's end\n", a.job.name.c_str(), ratio);
        overlap.push_back(absl::StrFormat("%s: %.3f", JsonString(a.job.name), ratio));
      }
    }
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"scale\",\n  \"quick\": ", quick ? "true" : "false", ",\n  \"torch_version\": \"",
      TorchVersion(), "\",\n  \"cpus\": ", HostCpuCount(),
      ",\n  \"cpu_bf16_arithmetic\": ", CpuHasBf16Arithmetic() ? "true" : "false",
      absl::StrFormat(",\n  \"gemm_flops\": {\"fp32\": %.4g, \"bf16\": %.4g},\n  \"gemm_flops_before\": {\"fp32\": %.4g, "
                      "\"bf16\": %.4g},\n  \"gemm_flops_after\": {\"fp32\": %.4g, \"bf16\": %.4g},\n  \"runs\": [\n",
                      gemm_fp32, gemm_bf16, fp32_before, bf16_before, fp32_after, bf16_after),
      absl::StrJoin(rows, ",\n"), "\n  ],\n  \"bf16_native_speedup\": {", absl::StrJoin(speedups, ", "),
      "},\n  \"overlap_speedup\": {", absl::StrJoin(overlap, ", "), "}\n}\n");
  return WriteBenchResult(quick ? "scale_quick" : "scale", absl::GetFlag(FLAGS_out), json);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
