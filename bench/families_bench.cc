// The Llama family at scale, in one run:
//
// * llama-3.2-1b fully fine-tuned in bf16 at 512 tokens on the simulated
//   device with memory.device_budget 1 GiB (its tied 128256 x 2048
//   embedding is kept in four pieces: see VocabPieces) and
//   memory.host_budget 12 GiB,
//   the rest on the disk tier (a directory under --disk_dir): s/step, its
//   fraction of the bf16 GEMM rate, the step's split, peak RSS. The batch is
//   8 sequences in 8 micro-batches (train.grad_accum_steps: 8), as a user
//   short of device memory sets it.
// * qwen2.5-0.5b (and, where the host holds its fp32 training state,
//   llama-3.2-1b) with an ample device, chunked beside the plain LibTorch
//   loop of the same model in fp32, and chunked in bf16.
// * Generation with llama-3.2-1b, 256 tokens greedy, with the key/value
//   cache and without it (the whole window recomputed each token).
//
// Beside each training run, its floor measured in the same run: the step's
// matrix products at its shapes, and its disk traffic (the bytes a steady
// step moved to and from the disk tier) at the disk's own O_DIRECT
// bandwidth, measured in the tier's directory.
//
//   bazel run -c opt //bench:families [-- --quick] [--steps=N] [--disk_dir=DIR]
//
// --quick (under three minutes) runs the small presets with the same keys.
// Writes bench/results/families.json (families_quick.json with --quick)
// and prints a table. Figures only; nothing here passes or fails on a time.

#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_output.h"
#include "bench/floor.h"
#include "bench/sim_trial.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/common/host_info.h"
#include "engine/device/device.h"
#include "engine/model/model_config.h"
#include "engine/train/generator.h"
#include "engine/train/hf_export.h"

ABSL_FLAG(bool, quick, false, "Small presets (under three minutes).");
ABSL_FLAG(int64_t, steps, 4, "Steps a training run, the warm-up included.");
ABSL_FLAG(int64_t, tokens, 256, "Tokens to generate.");
ABSL_FLAG(std::string, disk_dir, "/var/tmp", "Where the disk tier's directory is made.");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/families.json).");
ABSL_FLAG(std::string, only, "", "Run only the runs whose name contains this.");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

uint64_t PeakRssBytes() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

struct Job {
  std::string name;
  std::string preset;
  int64_t seq_len;
  int64_t batch;
  int64_t grad_accum_steps;
  TrainOptions::Precision precision;
  uint64_t device_bytes;
  bool chunked;            // false: the plain LibTorch loop
  uint64_t host_budget;    // 0: none
  bool disk = false;       // a disk tier
};

struct Result {
  Job job;
  std::string error;
  int64_t parameters = 0;
  std::vector<double> losses, seconds;
  double step_seconds = 0, tokens_per_second = 0, achieved_flops = 0, fraction_of_gemm = 0;
  StepSplit split;
  double disk_bytes = 0;  // a steady step's, both ways
  double floor_products = 0, floor_disk = 0;
  uint64_t peak_rss = 0;
  size_t recomputed_blocks = 0;  // in the last step
};

Result RunJob(const Job& job, const DiskBandwidth& disk) {
  Result result;
  result.job = job;
  ModelConfig model = *ModelPreset(job.preset);
  model.seq_len = job.seq_len;
  model.dropout = 0;
  result.parameters = model.ParameterCount();
  std::optional<MemoryOptions> memory;
  std::string disk_dir;
  if (job.chunked) {
    memory = MemoryOptions();
    memory->recompute = MemoryOptions::Recompute::kAuto;
    memory->host_budget_bytes = job.host_budget;
    if (job.disk) {
      disk_dir = absl::StrCat(absl::GetFlag(FLAGS_disk_dir), "/ferry-families-", getpid());
      memory->disk_dir = disk_dir;
      memory->disk_budget_bytes = 64 * kGiB;
    }
  }
  // The device is gone before the floors are timed: while it lives, the
  // host's allocations count against it.
  std::unique_ptr<Trial> trial;
  {
    SimulatedDevice device(job.device_bytes);
    trial = TrainOn(&device, model, absl::GetFlag(FLAGS_steps), job.batch, memory, job.precision,
                    job.grad_accum_steps, HostCpuCount());
  }
  if (!disk_dir.empty()) std::system(("rm -rf '" + disk_dir + "'").c_str());
  if (!trial->status.ok()) result.error = std::string(trial->status.message());
  const std::vector<StepReport>& r = trial->observer.reports;
  std::vector<double> compute, optimizer, exposed_disk, transfer, disk_bytes;
  for (size_t i = 0; i < r.size(); ++i) {
    result.losses.push_back(r[i].loss);
    if (i == 0) continue;  // the warm-up
    result.seconds.push_back(r[i].step_seconds);
    const StepSplit s = SplitOf(r[i]);
    compute.push_back(s.compute);
    optimizer.push_back(s.optimizer);
    exposed_disk.push_back(s.exposed_disk);
    transfer.push_back(s.exposed_transfer);
    disk_bytes.push_back(double(r[i].memory_stats.host_to_disk_bytes + r[i].memory_stats.disk_to_host_bytes));
  }
  if (!r.empty()) result.recomputed_blocks = r.back().recomputed_blocks.size();
  result.step_seconds = Median(result.seconds);
  result.split = {Median(compute), Median(optimizer), Median(exposed_disk), Median(transfer)};
  result.disk_bytes = Median(disk_bytes);
  if (result.step_seconds > 0) {
    result.tokens_per_second = double(job.batch * job.seq_len) / result.step_seconds;
    result.achieved_flops = 6.0 * double(result.parameters) * result.tokens_per_second;
  }
  result.peak_rss = PeakRssBytes();
  // The floors, once the run's device is gone.
  const bool bf16 = job.precision == TrainOptions::Precision::kBf16 && CpuHasBf16Arithmetic();
  result.floor_products = StepProductSeconds(model, job.batch * job.seq_len, bf16 ? at::kBFloat16 : at::kFloat);
  const double bandwidth = std::min(disk.read, disk.write);
  result.floor_disk = bandwidth > 0 ? result.disk_bytes / bandwidth : 0;
  return result;
}

struct Generation {
  std::string preset;
  std::string error;
  int64_t tokens = 0;
  double cached_seconds = 0, plain_seconds = 0;
  int64_t plain_tokens = 0;
  // Greedy tokens the two agree on before the first that differs (from
  // random weights the logits are nearly level, and a last-bit difference
  // of the two computations can tip an argmax).
  int64_t same_tokens = 0;
};

// Greedy generation from random weights (the cost does not depend on
// them), whole on an ample device in fp32, with and without the cache.
Generation MeasureGeneration(const std::string& preset, int64_t tokens) {
  Generation g;
  g.preset = preset;
  ModelConfig model = *ModelPreset(preset);
  model.seq_len = std::min<int64_t>(model.MaxPositions(), tokens + 16);
  model.dropout = 0;
  SimulatedDevice device(HostMemoryTotalBytes() / 2);
  // The whole model on the device in fp32, its values drawn as a job's
  // first step starts from.
  TrainOptions options;
  options.threads = HostCpuCount();
  absl::StatusOr<std::unique_ptr<InferenceModel>> loaded =
      LoadInferenceModel("", model, options, std::nullopt, &device);
  if (!loaded.ok()) {
    g.error = std::string(loaded.status().message());
    return g;
  }
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  auto run = [&](bool cache, int64_t n, std::vector<int64_t>* out) {
    SamplingOptions o;
    o.max_tokens = n;
    o.temperature = 0;
    o.use_cache = cache;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<GenerationStats> stats = ferry::Generate(**loaded, prompt, o, [&](int64_t t) {
      out->push_back(t);
      return true;
    });
    if (!stats.ok()) g.error = std::string(stats.status().message());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<int64_t> cached, plain;
  g.tokens = tokens;
  std::fprintf(stderr, "families: generating %lld tokens with %s, with the cache\n", static_cast<long long>(tokens),
               preset.c_str());
  g.cached_seconds = run(true, tokens, &cached);
  std::fprintf(stderr, "families: and without it\n");
  g.plain_tokens = tokens;
  g.plain_seconds = run(false, tokens, &plain);
  while (g.same_tokens < static_cast<int64_t>(std::min(cached.size(), plain.size())) &&
         cached[static_cast<size_t>(g.same_tokens)] == plain[static_cast<size_t>(g.same_tokens)]) {
    ++g.same_tokens;
  }
  return g;
}

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  at::set_num_threads(HostCpuCount());
  std::fprintf(stderr, "families: measuring the GEMM rate and the disk's bandwidth\n");
  const double gemm_fp32 = MeasureMatmulFlops(c10::Device(c10::kCPU), at::kFloat, 1024, 1.0);
  const double gemm_bf16 = MeasureMatmulFlops(c10::Device(c10::kCPU), at::kBFloat16, 1024, 1.0);
  const DiskBandwidth disk = MeasureDiskBandwidth(absl::GetFlag(FLAGS_disk_dir), quick ? 64 * kMiB : 512 * kMiB);

  using P = TrainOptions::Precision;
  const std::string big = quick ? "llama-tiny" : "llama-3.2-1b";
  const std::string small = quick ? "qwen2-tiny" : "qwen2.5-0.5b";
  const int64_t seq = quick ? 128 : 512;
  const uint64_t ample = HostMemoryTotalBytes() / 2;
  const uint64_t budget = quick ? 4 * kMiB : 1 * kGiB;
  const uint64_t host = quick ? 5 * kMiB : 12 * kGiB;
  // fp32 training state (16 bytes a parameter) beside the plain loop's own:
  // run llama-3.2-1b's ample pair only where the host holds both.
  const bool big_ample = quick || 16.0 * double(ModelPreset(big)->ParameterCount()) < 0.6 * double(ample);
  std::vector<Job> jobs = {
      {big + " bf16, " + (quick ? "4 MiB" : "1 GiB") + " device, " + (quick ? "5 MiB" : "12 GiB") +
           " host, disk tier, 8 micro-batches",
       big, seq, 8, 8, P::kBf16, budget, true, host, true},
      {small + " fp32, ample device", small, seq, 1, 1, P::kFp32, ample, true, 0},
      {small + " fp32, plain LibTorch loop", small, seq, 1, 1, P::kFp32, ample, false, 0},
      {small + " bf16, ample device", small, seq, 1, 1, P::kBf16, ample, true, 0},
  };
  if (big_ample) {
    jobs.push_back({big + " fp32, ample device", big, seq, 1, 1, P::kFp32, ample, true, 0});
    jobs.push_back({big + " fp32, plain LibTorch loop", big, seq, 1, 1, P::kFp32, ample, false, 0});
  }
  std::vector<Result> results;
  for (const Job& job : jobs) {
    if (!absl::GetFlag(FLAGS_only).empty() && job.name.find(absl::GetFlag(FLAGS_only)) == std::string::npos) continue;
    std::fprintf(stderr, "families: %s (%lld steps)\n", job.name.c_str(),
                 static_cast<long long>(absl::GetFlag(FLAGS_steps)));
    results.push_back(RunJob(job, disk));
    if (!results.back().error.empty()) std::fprintf(stderr, "  failed: %s\n", results.back().error.c_str());
    Result& r = results.back();
    const double gemm = r.job.precision == P::kBf16 && CpuHasBf16Arithmetic() ? gemm_bf16 : gemm_fp32;
    r.fraction_of_gemm = gemm > 0 ? r.achieved_flops / gemm : 0;
  }
  std::vector<Generation> generations;
  if (absl::GetFlag(FLAGS_only).empty() || absl::StrContains("generation", absl::GetFlag(FLAGS_only))) {
    generations.push_back(MeasureGeneration(big, quick ? 64 : absl::GetFlag(FLAGS_tokens)));
  }

  std::printf("\nGEMM rate, %d threads: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s; bf16 arithmetic: %s; disk (O_DIRECT, "
              "%s): write %.0f MB/s, read %.0f MB/s\n\n",
              HostCpuCount(), gemm_fp32 / 1e9, gemm_bf16 / 1e9, CpuHasBf16Arithmetic() ? "yes" : "no",
              absl::GetFlag(FLAGS_disk_dir).c_str(), disk.write / 1e6, disk.read / 1e6);
  std::printf("%-72s %9s %8s %7s  %-34s %9s %9s %7s\n", "run", "s/step", "tok/s", "of GEMM",
              "compute/optimizer/disk/transfer s", "products", "disk", "RSS GB");
  std::vector<std::string> rows;
  for (const Result& r : results) {
    std::printf("%-72s %9.2f %8.1f %6.1f%%  %6.2f / %5.2f / %5.2f / %5.2f      %8.2fs %8.2fs %7.1f%s\n",
                r.job.name.c_str(), r.step_seconds, r.tokens_per_second, 100 * r.fraction_of_gemm, r.split.compute,
                r.split.optimizer, r.split.exposed_disk, r.split.exposed_transfer, r.floor_products, r.floor_disk,
                r.peak_rss / 1e9, r.error.empty() ? "" : "  FAILED");
    rows.push_back(absl::StrCat(
        "    {\"name\": ", JsonString(r.job.name), ", \"preset\": \"", r.job.preset, "\", \"seq_len\": ",
        r.job.seq_len, ", \"batch\": ", r.job.batch, ", \"grad_accum_steps\": ", r.job.grad_accum_steps,
        ", \"parameters\": ", r.parameters, ", \"precision\": \"",
        r.job.precision == P::kBf16 ? "bf16" : "fp32", "\", \"device_budget_bytes\": ", r.job.device_bytes,
        ", \"host_budget_bytes\": ", r.job.host_budget, ", \"disk_tier\": ", r.job.disk ? "true" : "false",
        ", \"chunked\": ", r.job.chunked ? "true" : "false", ", \"error\": ", JsonString(r.error),
        ",\n     \"losses\": ", JsonList(r.losses), ", \"step_seconds_all\": ", JsonList(r.seconds),
        absl::StrFormat(",\n     \"step_seconds\": %.4f, \"tokens_per_second\": %.2f, \"achieved_flops\": %.4g, "
                        "\"fraction_of_gemm\": %.4f,\n     \"step_split\": {\"compute\": %.3f, \"optimizer\": %.3f, "
                        "\"exposed_disk\": %.3f, \"exposed_transfer\": %.3f}, \"disk_bytes_per_step\": %.4g, "
                        "\"floor_seconds\": {\"products\": %.3f, \"disk\": %.3f}, \"peak_rss_bytes\": %llu, "
                        "\"recomputed_blocks\": %zu}",
                        r.step_seconds, r.tokens_per_second, r.achieved_flops, r.fraction_of_gemm, r.split.compute,
                        r.split.optimizer, r.split.exposed_disk, r.split.exposed_transfer, r.disk_bytes,
                        r.floor_products, r.floor_disk, static_cast<unsigned long long>(r.peak_rss),
                        r.recomputed_blocks)));
  }
  std::printf("\n%-72s %10s %12s\n", "against its floor (the larger of products and disk)", "step/floor",
              "vs plain");
  std::vector<std::string> ratios;
  for (const Result& r : results) {
    const double floor = std::max(r.floor_products, r.floor_disk);
    double plain = 0;
    for (const Result& p : results) {
      if (!p.job.chunked && p.job.preset == r.job.preset && p.job.precision == r.job.precision && r.job.chunked &&
          p.step_seconds > 0 && r.step_seconds > 0) {
        plain = p.step_seconds / r.step_seconds;
      }
    }
    std::printf("%-72s %9.2fx %11s\n", r.job.name.c_str(), floor > 0 ? r.step_seconds / floor : 0.0,
                plain > 0 ? absl::StrFormat("%.2fx", plain).c_str() : "-");
    ratios.push_back(absl::StrFormat("{\"name\": %s, \"step_over_floor\": %.3f, \"speed_vs_plain\": %.3f}",
                                     JsonString(r.job.name), floor > 0 ? r.step_seconds / floor : 0.0, plain));
  }
  std::vector<std::string> gen_rows;
  for (const Generation& g : generations) {
    const double cached = g.cached_seconds > 0 ? g.tokens / g.cached_seconds : 0;
    const double plain = g.plain_seconds > 0 ? g.plain_tokens / g.plain_seconds : 0;
    std::printf("\ngeneration, %s, %lld tokens greedy: with the cache %.2f tokens/s, without %.2f tokens/s (%.1fx); "
                "the first %lld tokens the same%s\n",
                g.preset.c_str(), static_cast<long long>(g.tokens), cached, plain, plain > 0 ? cached / plain : 0.0,
                static_cast<long long>(g.same_tokens), g.error.empty() ? "" : ("  FAILED: " + g.error).c_str());
    gen_rows.push_back(absl::StrFormat(
        "    {\"preset\": \"%s\", \"tokens\": %d, \"cached_tokens_per_second\": %.3f, "
        "\"uncached_tokens_per_second\": %.3f, \"speedup\": %.2f, \"same_leading_tokens\": %d, \"error\": %s}",
        g.preset, g.tokens, cached, plain, plain > 0 ? cached / plain : 0.0, g.same_tokens, JsonString(g.error)));
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"families\",\n  \"quick\": ", quick ? "true" : "false", ",\n  \"torch_version\": \"",
      TorchVersion(), "\",\n  \"cpus\": ", HostCpuCount(),
      ",\n  \"cpu_bf16_arithmetic\": ", CpuHasBf16Arithmetic() ? "true" : "false",
      absl::StrFormat(",\n  \"gemm_flops\": {\"fp32\": %.4g, \"bf16\": %.4g},\n  \"disk_bandwidth\": {\"write\": "
                      "%.4g, \"read\": %.4g},\n  \"runs\": [\n",
                      gemm_fp32, gemm_bf16, disk.write, disk.read),
      absl::StrJoin(rows, ",\n"), "\n  ],\n  \"ratios\": [", absl::StrJoin(ratios, ", "), "],\n  \"generation\": [\n",
      absl::StrJoin(gen_rows, ",\n"), "\n  ]\n}\n");
  return WriteBenchResult(quick ? "families_quick" : "families", absl::GetFlag(FLAGS_out), json);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
