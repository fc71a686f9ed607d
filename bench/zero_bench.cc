// Chunks sharded across data ranks (parallel.shard), measured in one run:
//   1. per-rank model data by kind (the memory manager's own accounting) and
//      what one rank sends per step under the ring algorithm, for shard
//      none, optimizer and full at D = 2 and 4, against 16 B x params / D;
//   2. the largest model D = 2 ranks train with every chunk kept on the host
//      (static policy) under a per-rank host budget, for each shard level:
//      layers doubled until a run is refused, then bisected.
// Ranks are threads of this process with Gloo over an in-process store, on
// one simulated device; bf16 mixed precision (weights and gradients 2 B,
// masters and moments 12 B per parameter).
//
//   bazel run -c opt //bench:zero [-- --quick]
//
// Writes bench/results/zero.json and prints the tables. Figures only.

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

ABSL_FLAG(bool, quick, false, "Smaller models and budget (under three minutes).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/zero.json).");

namespace ferry {
namespace {

constexpr const char* kShardNames[] = {"none", "optimizer", "full"};
constexpr MemoryOptions::Shard kShards[] = {MemoryOptions::Shard::kNone, MemoryOptions::Shard::kOptimizer,
                                            MemoryOptions::Shard::kFull};
constexpr int kShardLevels = 3;

TrainOptions Training(int64_t steps) {
  TrainOptions train;
  train.steps = steps;
  train.batch_size = 4;
  train.lr = 1e-3;
  train.warmup_steps = 1;
  train.threads = 1;
  train.precision = TrainOptions::Precision::kBf16;
  return train;
}

struct BytesRun {
  std::string shard;
  int data = 0;
  uint64_t kind_bytes[3] = {0, 0, 0};  // rank 0's, by PayloadKind
  uint64_t wire_bytes_per_step = 0;
  double step_seconds = 0;
  std::string error;
  uint64_t model_bytes() const { return kind_bytes[0] + kind_bytes[1] + kind_bytes[2]; }
};

BytesRun MeasureBytes(const ModelConfig& model, int s, int data, int64_t steps) {
  BytesRun run;
  run.shard = kShardNames[s];
  run.data = data;
  SimulatedDevice device(uint64_t{16} << 30);
  MemoryOptions memory;
  memory.shard = kShards[s];
  const auto ranks = TrainRanks(&device, model, Training(steps), memory, 1, data);
  if (absl::Status failed = FirstFailure(ranks); !failed.ok()) {
    run.error = std::string(failed.message());
    return run;
  }
  for (const PayloadReport& p : ranks[0]->observer.placement.payloads) {
    run.kind_bytes[static_cast<int>(p.kind)] += p.bytes;
  }
  run.wire_bytes_per_step = ranks[0]->StepWireBytes() / static_cast<uint64_t>(steps);
  run.step_seconds = Median(SteadyStepSeconds(ranks[0]->observer.reports));
  return run;
}

struct CapacityRun {
  std::string shard;
  int64_t layers = 0;  // the most that trained; 0: not even one
  int64_t params = 0;
  uint64_t peak_host_model_bytes = 0;  // rank 0's, at that size
  int trials = 0;
  std::string refusal;  // at one layer more
};

ModelConfig Sized(ModelConfig model, int64_t layers) {
  model.layers = layers;
  return model;
}

// Whether D = 2 ranks train `model` for two steps with every chunk on the
// host within `host_budget` each; `peak` gets rank 0's peak host bytes for
// model data, `error` the refusal.
bool Trains(const ModelConfig& model, int s, uint64_t host_budget, uint64_t* peak, std::string* error) {
  SimulatedDevice device(uint64_t{16} << 30);
  MemoryOptions memory;
  memory.shard = kShards[s];
  memory.policy = MemoryOptions::Policy::kStatic;
  memory.static_param_host_fraction = 1.0;
  memory.static_optimizer_host_fraction = 1.0;
  memory.host_budget_bytes = host_budget;
  const auto ranks = TrainRanks(&device, model, Training(2), memory, 1, 2);
  if (absl::Status failed = FirstFailure(ranks); !failed.ok()) {
    *error = std::string(failed.message());
    return false;
  }
  *peak = 0;
  for (const StepReport& r : ranks[0]->observer.reports) {
    *peak = std::max(*peak, r.memory_stats.peak_host_model_bytes);
  }
  return true;
}

CapacityRun MeasureCapacity(const ModelConfig& family, int s, uint64_t host_budget) {
  CapacityRun run;
  run.shard = kShardNames[s];
  auto attempt = [&](int64_t layers) {
    ++run.trials;
    uint64_t peak = 0;
    std::string error;
    const bool ok = Trains(Sized(family, layers), s, host_budget, &peak, &error);
    std::fprintf(stderr, "    shard %s, %lld layers: %s\n", run.shard.c_str(), static_cast<long long>(layers),
                 ok ? "trains" : "refused");
    if (ok && layers > run.layers) {
      run.layers = layers;
      run.peak_host_model_bytes = peak;
    }
    if (!ok) run.refusal = error;
    return ok;
  };
  int64_t high = 1;  // the first size that is refused
  while (high <= 1024 && attempt(high)) high *= 2;
  int64_t low = high / 2;  // trains (0: nothing does)
  while (high - low > 1) {
    const int64_t mid = (low + high) / 2;
    (attempt(mid) ? low : high) = mid;
  }
  if (run.layers > 0) run.params = Sized(family, run.layers).ParameterCount();
  return run;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  ModelConfig model;
  model.layers = quick ? 2 : 4;
  model.hidden = quick ? 128 : 256;
  model.heads = 4;
  model.vocab_size = 2048;
  model.seq_len = 64;
  model.dropout = 0.1;
  const int64_t steps = 4;
  const double params = double(model.ParameterCount());

  std::fprintf(stderr, "zero: %lld parameters, bf16\n", static_cast<long long>(model.ParameterCount()));
  std::vector<BytesRun> bytes;
  for (int data : {2, 4}) {
    for (int s = 0; s < kShardLevels; ++s) {
      bytes.push_back(MeasureBytes(model, s, data, steps));
      std::fprintf(stderr, "  shard %s, D=%d: %s\n", kShardNames[s], data,
                   bytes.back().error.empty() ? "done" : bytes.back().error.c_str());
    }
  }

  ModelConfig family = model;
  const uint64_t host_budget = (quick ? uint64_t{48} : uint64_t{256}) << 20;
  std::fprintf(stderr, "zero: capacity at D=2 under %llu MiB of host memory per rank\n",
               static_cast<unsigned long long>(host_budget >> 20));
  std::vector<CapacityRun> capacity;
  for (int s = 0; s < kShardLevels; ++s) capacity.push_back(MeasureCapacity(family, s, host_budget));

  std::printf("\nModel data per rank (rank 0, the manager's accounting; %.2f M parameters, bf16)\n", params / 1e6);
  std::printf("%-10s %3s %10s %10s %10s %10s %8s %14s %9s %14s\n", "shard", "D", "params", "grads", "optimizer",
              "total MiB", "B/param", "vs 16B*P/D", "s/step", "wire MiB/step");
  for (const BytesRun& r : bytes) {
    const double mib = 1 << 20;
    std::printf("%-10s %3d %10.2f %10.2f %10.2f %10.2f %8.2f %13.2fx %9.3f %14.2f%s\n", r.shard.c_str(), r.data,
                r.kind_bytes[0] / mib, r.kind_bytes[1] / mib, r.kind_bytes[2] / mib, r.model_bytes() / mib,
                r.model_bytes() / params, r.model_bytes() / (16.0 * params / r.data), r.step_seconds,
                r.wire_bytes_per_step / mib, r.error.empty() ? "" : ("  error: " + r.error).c_str());
  }
  std::printf("\nLargest model D = 2 ranks train, every chunk on the host, %llu MiB of host memory per rank\n",
              static_cast<unsigned long long>(host_budget >> 20));
  std::printf("%-10s %8s %14s %16s %10s\n", "shard", "layers", "parameters", "peak host MiB", "vs none");
  for (const CapacityRun& r : capacity) {
    std::printf("%-10s %8lld %14lld %16.1f %9.2fx\n", r.shard.c_str(), static_cast<long long>(r.layers),
                static_cast<long long>(r.params), r.peak_host_model_bytes / double(1 << 20),
                capacity[0].params > 0 ? double(r.params) / double(capacity[0].params) : 0.0);
  }

  std::vector<std::string> rows;
  for (const BytesRun& r : bytes) {
    rows.push_back(absl::StrFormat(
        "    {\"shard\": \"%s\", \"data\": %d, \"param_bytes\": %d, \"grad_bytes\": %d, \"optimizer_bytes\": %d, "
        "\"model_bytes\": %d, \"bytes_per_param\": %.4f, \"vs_16_bytes_per_param_over_d\": %.4f, "
        "\"wire_bytes_per_step\": %d, \"step_seconds\": %.6f, \"error\": %s}",
        r.shard, r.data, r.kind_bytes[0], r.kind_bytes[1], r.kind_bytes[2], r.model_bytes(), r.model_bytes() / params,
        r.model_bytes() / (16.0 * params / r.data), r.wire_bytes_per_step, r.step_seconds, JsonString(r.error)));
  }
  std::vector<std::string> caps;
  for (const CapacityRun& r : capacity) {
    caps.push_back(absl::StrFormat(
        "    {\"shard\": \"%s\", \"layers\": %d, \"params\": %d, \"peak_host_model_bytes\": %d, \"trials\": %d, "
        "\"vs_none\": %.4f, \"refused_at_one_more\": %s}",
        r.shard, r.layers, r.params, r.peak_host_model_bytes, r.trials,
        capacity[0].params > 0 ? double(r.params) / double(capacity[0].params) : 0.0, JsonString(r.refusal)));
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"zero\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(), ",\n  \"precision\": \"bf16\",\n  \"model\": "
      "{\"layers\": ", model.layers, ", \"hidden\": ", model.hidden, ", \"heads\": ", model.heads,
      ", \"vocab_size\": ", model.vocab_size, ", \"seq_len\": ", model.seq_len, ", \"params\": ",
      model.ParameterCount(), "},\n  \"bytes\": [\n", absl::StrJoin(rows, ",\n"),
      "\n  ],\n  \"capacity\": {\"data\": 2, \"host_budget_bytes\": ", host_budget, ", \"hidden\": ", family.hidden,
      ", \"runs\": [\n", absl::StrJoin(caps, ",\n"), "\n  ]}\n}\n");
  return WriteBenchResult("zero", absl::GetFlag(FLAGS_out), json);
}
