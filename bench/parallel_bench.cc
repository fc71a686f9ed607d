// Tensor and data parallelism on the CPU, measured in one run: the same GPT
// and global batch trained with (tensor, data) = (1,1), (2,1) and (1,2).
// Ranks are threads of this process with Gloo over an in-process store,
// sharing one simulated device with room for all; the one-rank run gets both
// cores as intra-op threads, each rank of a two-rank run one. For each: tokens
// per second of the global batch (median steady step) and the bytes one rank
// hands to collectives per step (what a wire would carry, to within the
// algorithm's factor).
//
//   bazel run //bench:parallel [-- --quick]
//
// Writes bench/results/parallel.json and prints a table. Figures only.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_output.h"
#include "bench/rank_trial.h"
#include "engine/common/host_info.h"
#include "engine/parallel/communicator.h"

ABSL_FLAG(bool, quick, false, "A smaller model and fewer steps (under two minutes).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/parallel.json).");

namespace ferry {
namespace {

struct Run {
  int tensor = 1;
  int data = 1;
  double step_seconds = 0;
  double tokens_per_second = 0;
  uint64_t bytes_per_step = 0;
  std::string error;
};

Run Measure(const ModelConfig& model, int64_t steps, int64_t batch, int tensor, int data) {
  Run run;
  run.tensor = tensor;
  run.data = data;
  SimulatedDevice device(uint64_t{16} << 30);
  TrainOptions train;
  train.steps = steps;
  train.batch_size = batch;
  train.lr = 1e-3;
  train.warmup_steps = 1;
  train.threads = tensor * data == 1 ? static_cast<int>(HostCpuCount()) : 1;
  const std::vector<std::unique_ptr<RankTrial>> ranks = TrainRanks(&device, model, train, MemoryOptions(), tensor, data);
  if (absl::Status failed = FirstFailure(ranks); !failed.ok()) {
    run.error = std::string(failed.message());
    return run;
  }
  uint64_t rank0_bytes = 0;
  for (const auto* calls : {&ranks[0]->tensor_calls, &ranks[0]->data_calls}) {
    for (const CountingCommunicator::Call& call : *calls) rank0_bytes += call.bytes;
  }
  run.step_seconds = Median(SteadyStepSeconds(ranks[0]->observer.reports));
  run.tokens_per_second = run.step_seconds > 0 ? double(batch * model.seq_len) / run.step_seconds : 0;
  run.bytes_per_step = steps > 0 ? rank0_bytes / static_cast<uint64_t>(steps) : 0;
  return run;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  ModelConfig model;
  model.layers = quick ? 4 : 6;
  model.hidden = quick ? 256 : 384;
  model.heads = quick ? 4 : 6;
  model.vocab_size = 2048;
  model.seq_len = 128;
  model.dropout = 0.1;
  const int64_t batch = 8;
  const int64_t steps = quick ? 6 : 10;
  std::fprintf(stderr, "parallel: %lld layers, hidden %lld, %lld parameters, global batch %lld x %lld\n",
               static_cast<long long>(model.layers), static_cast<long long>(model.hidden),
               static_cast<long long>(model.ParameterCount()), static_cast<long long>(batch),
               static_cast<long long>(model.seq_len));
  std::vector<Run> runs;
  for (auto [tensor, data] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
    runs.push_back(Measure(model, steps, batch, tensor, data));
    const Run& r = runs.back();
    std::fprintf(stderr, "  tensor %d data %d: %s\n", tensor, data,
                 r.error.empty() ? absl::StrFormat("%.3f s/step", r.step_seconds).c_str() : r.error.c_str());
  }

  std::printf("\nParallel training on the CPU (%lld parameters, global batch %lld x %lld, same run)\n",
              static_cast<long long>(model.ParameterCount()), static_cast<long long>(batch),
              static_cast<long long>(model.seq_len));
  std::printf("%-7s %-5s %10s %12s %12s %18s\n", "tensor", "data", "s/step", "tokens/s", "vs 1x1",
              "MiB/step/rank");
  for (const Run& r : runs) {
    std::printf("%-7d %-5d %10.3f %12.0f %11.2fx %18.2f%s\n", r.tensor, r.data, r.step_seconds,
                r.tokens_per_second, runs[0].tokens_per_second > 0 ? r.tokens_per_second / runs[0].tokens_per_second : 0,
                double(r.bytes_per_step) / (1 << 20), r.error.empty() ? "" : ("  error: " + r.error).c_str());
  }
  std::printf("(bytes one rank hands to all-reduces and all-gathers per step; 2 cores in every run)\n");

  std::vector<std::string> rows;
  for (const Run& r : runs) {
    rows.push_back(absl::StrFormat(
        "    {\"tensor\": %d, \"data\": %d, \"tokens_per_second\": %.1f, \"step_seconds\": %.6f, "
        "\"bytes_communicated_per_step\": %d, \"error\": %s}",
        r.tensor, r.data, r.tokens_per_second, r.step_seconds, r.bytes_per_step, JsonString(r.error)));
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"parallel\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(), ",\n  \"model\": {\"layers\": ", model.layers,
      ", \"hidden\": ", model.hidden, ", \"heads\": ", model.heads, ", \"vocab_size\": ", model.vocab_size,
      ", \"seq_len\": ", model.seq_len, ", \"params\": ", model.ParameterCount(), "},\n  \"global_batch\": ", batch,
      ",\n  \"runs\": [\n", absl::StrJoin(rows, ",\n"), "\n  ]\n}\n");
  return WriteBenchResult("parallel", absl::GetFlag(FLAGS_out), json);
}
