// The memory manager's figures, all measured in one run on the simulated
// device:
//   1. capacity: the largest GPT that trains 3 steps with a 512 MiB device
//      and a 6 GiB host budget, for static (ZeRO-Offload's split) and auto;
//   2. traffic: bytes moved per steady step at device budgets of 25-100% of
//      one model's data, static vs auto, beside the least any policy could
//      move;
//   3. overhead: steady step time with an ample budget, auto vs the plain
//      LibTorch loop.
//
//   bazel run //bench:memory_bench [-- --quick]
//
// Writes bench/results/memory.json and prints tables. Figures only; nothing
// here passes or fails.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
#include "engine/common/host_info.h"
#include "engine/model/gpt_config.h"

ABSL_FLAG(bool, quick, false, "Smaller budgets and models (under two minutes).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/memory.json).");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr double kBytesPerParam = 16.0;  // fp32 weights, gradients, two moments

MemoryOptions Policy(MemoryOptions::Policy policy, uint64_t host_budget) {
  MemoryOptions m;
  m.policy = policy;
  m.host_budget_bytes = host_budget;
  return m;
}

GptConfig Model(int64_t layers, int64_t hidden, int64_t vocab, int64_t seq) {
  GptConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = hidden / 64;
  c.vocab_size = vocab;
  c.seq_len = seq;
  return c;
}

// --- 1. Capacity. ---

struct CapacityResult {
  int64_t params = 0;
  int64_t layers = 0;
  int64_t hidden = 0;
  int trials = 0;
  std::vector<std::string> log;
};

// For each hidden size, start from the layer count the budgets allow by
// arithmetic, then step down until 3 steps train; keep the largest success.
CapacityResult Capacity(MemoryOptions::Policy policy, uint64_t device_budget, uint64_t host_budget,
                        const std::vector<int64_t>& hiddens, int64_t vocab, int64_t seq, int64_t batch) {
  CapacityResult best;
  for (int64_t h : hiddens) {
    const int64_t block = 12 * h * h + 13 * h;
    const int64_t embeddings = vocab * h + seq * h + 2 * h;
    // Auto: model data lives on the host (16 B a parameter). Static: every
    // parameter also stays on the device (4 B), beside a gradient chunk and
    // the activations.
    const double room = policy == MemoryOptions::Policy::kAuto
                            ? double(host_budget) / kBytesPerParam
                            : 0.85 * double(device_budget) / 4.0;
    int64_t layers = static_cast<int64_t>((room - double(embeddings)) / double(block));
    for (int attempt = 0; attempt < 4 && layers >= 1; ++attempt) {
      const GptConfig model = Model(layers, h, vocab, seq);
      if (model.ParameterCount() <= best.params) break;
      std::unique_ptr<Trial> t = TrainOnSimulatedDevice(model, 3, batch, device_budget, Policy(policy, host_budget));
      ++best.trials;
      const std::string outcome = t->status.ok() ? "ok" : std::string(t->status.message()).substr(0, 120);
      best.log.push_back(absl::StrFormat("%s hidden %d layers %d (%d params): %s", PolicyName(policy), h,
                                         layers, model.ParameterCount(), outcome));
      std::fprintf(stderr, "  %s\n", best.log.back().c_str());
      if (t->status.ok()) {
        best.params = model.ParameterCount();
        best.layers = layers;
        best.hidden = h;
        break;
      }
      layers = std::max<int64_t>(layers - std::max<int64_t>(1, layers / 10), 0);
    }
  }
  return best;
}

// --- 2. Traffic. ---

struct TrafficRow {
  double budget_fraction = 0;
  uint64_t budget_bytes = 0;
  std::optional<uint64_t> static_bytes;
  std::optional<uint64_t> auto_bytes;
  // What auto's plan predicted.
  std::optional<uint64_t> planned_bytes;
  // Why a policy could not train at this budget.
  std::string static_error, auto_error;
  uint64_t least_bytes = 0;
  uint64_t bound_bytes = 0;
};

// Mean bytes moved per steady step (the first two steps, warm-up and the
// step that brings pinned chunks in, left out).
std::optional<uint64_t> SteadyTraffic(const Trial& t) {
  if (!t.status.ok()) return std::nullopt;
  uint64_t bytes = 0;
  int steps = 0;
  for (size_t s = kFirstSteadyStep; s < t.observer.reports.size(); ++s) {
    const StepMemoryStats& m = t.observer.reports[s].memory_stats;
    bytes += m.host_to_device_bytes + m.device_to_host_bytes;
    ++steps;
  }
  return steps > 0 ? bytes / static_cast<uint64_t>(steps) : 0;
}

// The least traffic at `budget`, as the benchmark's brief defines it: the
// model data that cannot stay resident beside the step's peak non-model
// memory, moved once each way.
uint64_t LeastTraffic(uint64_t model_data, uint64_t budget, uint64_t peak_non_model) {
  const uint64_t room = budget > peak_non_model ? budget - peak_non_model : 0;
  return model_data > room ? 2 * (model_data - room) : 0;
}

// A tighter lower bound: a parameter whose weights, gradients and optimizer
// states (16 B) cannot all stay on the device must at least bring its
// weights in and send its gradients out once a step (8 B) if the optimizer
// runs on the host; its states and master weights never move.
uint64_t WeightsAndGradientsBound(int64_t params, uint64_t budget, uint64_t peak_non_model) {
  const double room = budget > peak_non_model ? double(budget - peak_non_model) : 0.0;
  const double resident = std::min(double(params), room / kBytesPerParam);
  return static_cast<uint64_t>(8.0 * (double(params) - resident));
}

// --- 3. Overhead. ---

double MedianSteadySeconds(const Trial& t) { return Median(SteadyStepSeconds(t.observer.reports)); }

std::string Opt(const std::optional<uint64_t>& v) { return v ? absl::StrCat(*v) : "null"; }

std::string Mb(const std::optional<uint64_t>& v) {
  return v ? absl::StrFormat("%.1f", double(*v) / kMiB) : std::string("OOM");
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);

  // 1. Capacity.
  const uint64_t device_budget = quick ? 128 * kMiB : 512 * kMiB;
  const uint64_t host_budget = quick ? 1024 * kMiB : 6144 * kMiB;
  const int64_t vocab = quick ? 2048 : 8192, seq = quick ? 64 : 128, batch = 1;
  const std::vector<int64_t> hiddens = quick ? std::vector<int64_t>{512, 768} : std::vector<int64_t>{1024, 1536};
  std::fprintf(stderr, "capacity: device %lu MiB, host %lu MiB\n", device_budget / kMiB, host_budget / kMiB);
  CapacityResult static_cap = Capacity(MemoryOptions::Policy::kStatic, device_budget, host_budget, hiddens,
                                       vocab, seq, batch);
  CapacityResult auto_cap = Capacity(MemoryOptions::Policy::kAuto, device_budget, host_budget, hiddens,
                                     vocab, seq, batch);
  const double budgets = double(device_budget + host_budget);
  const double static_ratio = double(static_cap.params) * kBytesPerParam / budgets;
  const double auto_ratio = double(auto_cap.params) * kBytesPerParam / budgets;

  // 2. Traffic, for one model at fractions of its model data.
  // Short sequences: model data, not activations, should fill the device.
  const GptConfig traffic_model = quick ? Model(4, 256, 4096, 64) : Model(8, 512, 8192, 64);
  const int64_t traffic_batch = 2;
  const int64_t traffic_steps = quick ? 5 : 6;
  const int64_t n = traffic_model.ParameterCount();
  const uint64_t model_data = static_cast<uint64_t>(double(n) * kBytesPerParam);
  std::fprintf(stderr, "traffic: %lld parameters, %.1f MiB of model data\n", static_cast<long long>(n),
               double(model_data) / kMiB);
  // The step's activations, measured once with room to spare.
  std::unique_ptr<Trial> ample = TrainOnSimulatedDevice(traffic_model, 3, traffic_batch, 64 * model_data,
                                       Policy(MemoryOptions::Policy::kAuto, 0));
  uint64_t peak_non_model = 0;
  for (const StepReport& r : ample->observer.reports) {
    peak_non_model = std::max(peak_non_model, r.memory_stats.peak_non_model_bytes);
  }
  std::vector<TrafficRow> traffic;
  for (double fraction : {0.25, 0.5, 0.75, 1.0}) {
    TrafficRow row;
    row.budget_fraction = fraction;
    row.budget_bytes = static_cast<uint64_t>(fraction * double(model_data));
    std::unique_ptr<Trial> st = TrainOnSimulatedDevice(traffic_model, traffic_steps, traffic_batch, row.budget_bytes,
                                      Policy(MemoryOptions::Policy::kStatic, 0));
    row.static_bytes = SteadyTraffic(*st);
    if (!st->status.ok()) row.static_error = std::string(st->status.message()).substr(0, 160);
    std::unique_ptr<Trial> a = TrainOnSimulatedDevice(traffic_model, traffic_steps, traffic_batch, row.budget_bytes,
                                     Policy(MemoryOptions::Policy::kAuto, 0));
    row.auto_bytes = SteadyTraffic(*a);
    if (!a->status.ok()) row.auto_error = std::string(a->status.message()).substr(0, 160);
    row.planned_bytes = a->status.ok() ? std::optional<uint64_t>(a->observer.placement.planned_traffic_bytes)
                                       : std::nullopt;
    row.least_bytes = LeastTraffic(model_data, row.budget_bytes, peak_non_model);
    row.bound_bytes = WeightsAndGradientsBound(n, row.budget_bytes, peak_non_model);
    std::fprintf(stderr, "  %.0f%%: static %s MiB, auto %s MiB, least %.1f MiB, bound %.1f MiB\n",
                 100 * fraction, Mb(row.static_bytes).c_str(), Mb(row.auto_bytes).c_str(),
                 double(row.least_bytes) / kMiB, double(row.bound_bytes) / kMiB);
    if (!row.static_error.empty()) std::fprintf(stderr, "    static: %s\n", row.static_error.c_str());
    if (!row.auto_error.empty()) std::fprintf(stderr, "    auto: %s\n", row.auto_error.c_str());
    traffic.push_back(row);
  }

  // 3. Overhead: the same model with an ample budget, plain and auto
  // alternating so that drift in the machine's speed hits both.
  const int64_t overhead_steps = quick ? 8 : 20;
  std::vector<double> plain_s, auto_s;
  for (int round = 0; round < 2; ++round) {
    plain_s.push_back(MedianSteadySeconds(
        *TrainOnSimulatedDevice(traffic_model, overhead_steps, traffic_batch, 64 * model_data, std::nullopt)));
    auto_s.push_back(MedianSteadySeconds(*TrainOnSimulatedDevice(
        traffic_model, overhead_steps, traffic_batch, 64 * model_data, Policy(MemoryOptions::Policy::kAuto, 0))));
  }
  const double plain_seconds = (plain_s[0] + plain_s[1]) / 2;
  const double auto_seconds = (auto_s[0] + auto_s[1]) / 2;

  // Tables.
  std::printf("\nCapacity (device %lu MiB, host %lu MiB, vocab %lld, seq %lld, batch %lld)\n",
              device_budget / kMiB, host_budget / kMiB, static_cast<long long>(vocab),
              static_cast<long long>(seq), static_cast<long long>(batch));
  std::printf("%-8s %14s %8s %8s %8s\n", "policy", "parameters", "layers", "hidden", "ratio");
  std::printf("%-8s %14lld %8lld %8lld %8.3f\n", "static", static_cast<long long>(static_cap.params),
              static_cast<long long>(static_cap.layers), static_cast<long long>(static_cap.hidden), static_ratio);
  std::printf("%-8s %14lld %8lld %8lld %8.3f\n", "auto", static_cast<long long>(auto_cap.params),
              static_cast<long long>(auto_cap.layers), static_cast<long long>(auto_cap.hidden), auto_ratio);
  std::printf("auto trains %.2fx the parameters of static\n",
              static_cap.params > 0 ? double(auto_cap.params) / double(static_cap.params) : 0.0);

  std::printf("\nTraffic per steady step (%lld parameters, %.1f MiB of model data, peak activations %.1f MiB)\n",
              static_cast<long long>(n), double(model_data) / kMiB, double(peak_non_model) / kMiB);
  std::printf("%-7s %10s %10s %10s %10s %10s %10s %10s\n", "budget", "budget", "static", "auto", "least",
              "auto/least", "bound", "auto/bound");
  auto ratio = [](const std::optional<uint64_t>& a, uint64_t b) {
    return a && b > 0 ? absl::StrFormat("%.2f", double(*a) / double(b)) : std::string("-");
  };
  for (const TrafficRow& r : traffic) {
    std::printf("%-7s %10.1f %10s %10s %10.1f %10s %10.1f %10s\n",
                absl::StrFormat("%.0f%%", 100 * r.budget_fraction).c_str(), double(r.budget_bytes) / kMiB,
                Mb(r.static_bytes).c_str(), Mb(r.auto_bytes).c_str(), double(r.least_bytes) / kMiB,
                ratio(r.auto_bytes, r.least_bytes).c_str(), double(r.bound_bytes) / kMiB,
                ratio(r.auto_bytes, r.bound_bytes).c_str());
  }
  std::printf("(MiB per steady step; least: the model data that cannot stay resident, moved once each way;\n"
              " bound: weights in and gradients out for every parameter that cannot stay resident)\n");
  std::printf("\nOverhead with an ample budget: plain %.4f s/step, auto %.4f s/step, ratio %.3f\n", plain_seconds,
              auto_seconds, plain_seconds > 0 ? auto_seconds / plain_seconds : 0.0);

  // JSON.
  std::vector<std::string> rows;
  for (const TrafficRow& r : traffic) {
    rows.push_back(absl::StrFormat(
        "    {\"budget_fraction\": %.2f, \"budget_bytes\": %d, \"static_bytes\": %s, \"auto_bytes\": %s, "
        "\"auto_planned_bytes\": %s, \"least_bytes\": %d, \"weights_and_gradients_bound_bytes\": %d, "
        "\"static_error\": %s, \"auto_error\": %s}",
        r.budget_fraction, r.budget_bytes, Opt(r.static_bytes), Opt(r.auto_bytes), Opt(r.planned_bytes),
        r.least_bytes, r.bound_bytes, JsonString(r.static_error), JsonString(r.auto_error)));
  }
  auto trials = [](const CapacityResult& c) {
    std::vector<std::string> quoted;
    for (const std::string& s : c.log) quoted.push_back(JsonString(s));
    return absl::StrJoin(quoted, ", ");
  };
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"memory\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(),
      ",\n  \"capacity\": {\n    \"device_budget_bytes\": ", device_budget, ",\n    \"host_budget_bytes\": ",
      host_budget, ",\n    \"vocab_size\": ", vocab, ", \"seq_len\": ", seq, ", \"batch_size\": ", batch,
      ",\n    \"static\": {\"params\": ", static_cap.params, ", \"layers\": ", static_cap.layers,
      ", \"hidden\": ", static_cap.hidden, ", \"ratio\": ", absl::StrFormat("%.4f", static_ratio),
      ", \"trials\": [", trials(static_cap), "]},\n    \"auto\": {\"params\": ", auto_cap.params,
      ", \"layers\": ", auto_cap.layers, ", \"hidden\": ", auto_cap.hidden, ", \"ratio\": ",
      absl::StrFormat("%.4f", auto_ratio), ", \"trials\": [", trials(auto_cap), "]}\n  },\n",
      "  \"traffic_model\": {\"params\": ", n, ", \"model_data_bytes\": ", model_data,
      ", \"peak_non_model_bytes\": ", peak_non_model, "},\n  \"traffic\": [\n", absl::StrJoin(rows, ",\n"),
      "\n  ],\n  \"overhead\": {\"plain_seconds\": ", absl::StrFormat("%.6f", plain_seconds),
      ", \"auto_seconds\": ", absl::StrFormat("%.6f", auto_seconds), ", \"ratio\": ",
      absl::StrFormat("%.4f", plain_seconds > 0 ? auto_seconds / plain_seconds : 0.0), "}\n}\n");
  return ferry::WriteBenchResult("memory", absl::GetFlag(FLAGS_out), json);
}
