// The memory manager's figures, all measured in one run on the simulated
// device:
//   1. capacity: the largest GPT that trains 3 steps in bf16 with a 512 MiB
//      device and a 6 GiB host budget, for static (ZeRO-Offload's split) and
//      auto, and for auto with a disk tier (24 GiB by default) besides;
//   2. traffic: bytes moved per steady step at device budgets of 25-100% of
//      one model's data, static vs auto, beside auto's plan and a lower
//      bound for a host-side optimizer;
//   3. overhead: steady step time with an ample budget, auto vs the plain
//      LibTorch loop.
//
//   bazel run //bench:memory [-- --quick] [--disk_dir=DIR] [--disk_budget_mib=N]
//
// Writes bench/results/memory.json and prints tables. Figures only; nothing
// here passes or fails.

#include <malloc.h>

#include <algorithm>
#include <chrono>
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
#include "engine/memory/tier_plan.h"
#include "engine/model/model_config.h"

ABSL_FLAG(bool, quick, false, "Smaller budgets and models (under three minutes).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/memory.json).");
ABSL_FLAG(std::string, disk_dir, "/var/tmp/ferry-bench-memory",
          "Directory for the disk tier's chunk files (capacity, auto with disk).");
ABSL_FLAG(int64_t, disk_budget_mib, 0, "Disk budget of the capacity search's disk column (default 24 GiB; "
                                       "--quick 4 GiB).");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
// Model data a parameter: fp32 weights, gradients and two moments; or, in
// bf16, bf16 weights and gradients, fp32 moments and master weights. 16
// bytes either way.
constexpr double kBytesPerParam = 16.0;
// bf16: the weights, which stay on the host beside a disk tier.
constexpr double kBf16WeightBytes = 2.0;

MemoryOptions Policy(MemoryOptions::Policy policy, uint64_t host_budget) {
  MemoryOptions m;
  m.policy = policy;
  m.host_budget_bytes = host_budget;
  return m;
}

ModelConfig Model(int64_t layers, int64_t hidden, int64_t vocab, int64_t seq) {
  ModelConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = hidden / 64;
  c.vocab_size = vocab;
  c.seq_len = seq;
  return c;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// A trial of a billion parameters frees gigabytes in blocks of a few MB,
// which the C library keeps in its heap: give them back to the system, so
// that the search's later trials (and whatever else runs on the machine)
// find them.
void ReleaseFreedMemory() { malloc_trim(0); }

// --- 1. Capacity. ---

// One column of the capacity table: a policy and its budgets.
struct CapacitySetup {
  std::string name;  // "static", "auto", "auto_disk"
  MemoryOptions::Policy policy = MemoryOptions::Policy::kAuto;
  uint64_t device_budget = 0;
  uint64_t host_budget = 0;
  // 0: no disk tier.
  uint64_t disk_budget = 0;
  std::string disk_dir;
  std::vector<int64_t> hiddens;
  // Trials for each hidden size.
  int max_trials = 0;
};

struct CapacityResult {
  int64_t params = 0;
  int64_t layers = 0;
  int64_t hidden = 0;
  int trials = 0;
  double seconds = 0;
  // The largest success's run: host memory for model data at its peak (and
  // the plan's), the disk tier's bytes and chunks, disk bytes per steady
  // step, and its median steady step.
  uint64_t host_peak_bytes = 0;
  uint64_t planned_host_bytes = 0;
  uint64_t disk_bytes = 0;
  int disk_chunks = 0;
  int chunks = 0;
  uint64_t disk_read_bytes = 0;
  uint64_t disk_write_bytes = 0;
  uint64_t planned_disk_read_bytes = 0;
  uint64_t planned_disk_write_bytes = 0;
  double step_seconds = 0;
  std::vector<std::string> log;
};

// The layer count the budgets allow by arithmetic, for hidden size h. bf16:
// 16 bytes of model data a parameter.
int64_t EstimateLayers(const CapacitySetup& s, int64_t h, int64_t vocab, int64_t seq) {
  const double block = 12.0 * double(h * h) + 13.0 * double(h);
  const double embeddings = double(vocab * h + seq * h + 2 * h);
  double room = 0;
  if (s.policy == MemoryOptions::Policy::kStatic) {
    // Every parameter stays on the device (2 bytes), beside a gradient
    // chunk and the activations.
    room = 0.85 * double(s.device_budget) / 2.0;
  } else if (s.disk_budget == 0) {
    // Model data lives on the host.
    room = double(s.host_budget) / kBytesPerParam;
  } else {
    // The weights stay on the host (2 bytes), beside the disk tier's four
    // staging slots; gradients and optimizer states (14 bytes) fill the
    // rest of the host, then the disk.
    const double host = double(s.host_budget) - double(kDiskStagingSlots * kDiskSliceBytes);
    room = std::min(host / kBf16WeightBytes, (host + double(s.disk_budget)) / kBytesPerParam);
  }
  return static_cast<int64_t>((room - embeddings) / block);
}

// For each hidden size, start from the layer count the estimate gives (or
// the least that would beat the best so far): if it trains, step up by
// about a tenth until one fails; if it fails, step down until one trains;
// then halve the gap between the largest success and the smallest failure
// while trials remain.
CapacityResult Capacity(const CapacitySetup& s, int64_t vocab, int64_t seq, int64_t batch) {
  CapacityResult best;
  const auto started = std::chrono::steady_clock::now();
  for (int64_t h : s.hiddens) {
    int trials = 0;
    int64_t ok_layers = 0, failed_layers = 0;
    auto attempt = [&](int64_t layers) {
      const ModelConfig model = Model(layers, h, vocab, seq);
      MemoryOptions memory = Policy(s.policy, s.host_budget);
      if (s.disk_budget > 0) {
        memory.disk_dir = s.disk_dir;
        memory.disk_budget_bytes = s.disk_budget;
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::unique_ptr<Trial> t =
          TrainOnSimulatedDevice(model, 3, batch, s.device_budget, memory, TrainOptions::Precision::kBf16);
      const double seconds = Seconds(t0);
      ++trials;
      ++best.trials;
      const std::string outcome = t->status.ok() ? "ok" : std::string(t->status.message()).substr(0, 200);
      best.log.push_back(absl::StrFormat("%s hidden %d layers %d (%d params, %.0f s): %s", s.name, h, layers,
                                         model.ParameterCount(), seconds, outcome));
      std::fprintf(stderr, "  %s\n", best.log.back().c_str());
      if (!t->status.ok()) {
        failed_layers = failed_layers == 0 ? layers : std::min(failed_layers, layers);
        t.reset();
        ReleaseFreedMemory();
        return false;
      }
      ok_layers = std::max(ok_layers, layers);
      if (model.ParameterCount() > best.params) {
        best.params = model.ParameterCount();
        best.layers = layers;
        best.hidden = h;
        best.host_peak_bytes = 0;
        const std::vector<StepReport>& r = t->observer.reports;
        for (const StepReport& report : r) {
          best.host_peak_bytes = std::max(best.host_peak_bytes, report.memory_stats.peak_host_model_bytes);
        }
        const PlacementReport& p = t->observer.placement;
        best.planned_host_bytes = p.planned_host_bytes;
        best.planned_disk_read_bytes = p.planned_disk_read_bytes;
        best.planned_disk_write_bytes = p.planned_disk_write_bytes;
        best.chunks = static_cast<int>(p.payloads.size() / 3);
        best.disk_bytes = best.disk_read_bytes = best.disk_write_bytes = 0;
        best.disk_chunks = 0;
        if (!r.empty()) {
          for (int k = 0; k < 3; ++k) best.disk_bytes += r.back().memory_stats.disk_bytes[k];
          best.disk_chunks = r.back().memory_stats.disk_chunks;
        }
        int steady = 0;
        for (size_t i = kFirstSteadyStep; i < r.size(); ++i, ++steady) {
          best.disk_read_bytes += r[i].memory_stats.disk_to_host_bytes;
          best.disk_write_bytes += r[i].memory_stats.host_to_disk_bytes;
        }
        if (steady > 0) {
          best.disk_read_bytes /= static_cast<uint64_t>(steady);
          best.disk_write_bytes /= static_cast<uint64_t>(steady);
        }
        best.step_seconds = Median(SteadyStepSeconds(r));
      }
      t.reset();
      ReleaseFreedMemory();
      return true;
    };
    auto params_of = [&](int64_t layers) { return Model(layers, h, vocab, seq).ParameterCount(); };
    int64_t layers = std::max<int64_t>(1, EstimateLayers(s, h, vocab, seq));
    // Nothing at this hidden size below the best so far is worth a trial.
    bool below_best = false;
    while (params_of(layers) <= best.params) {
      ++layers;
      below_best = true;
    }
    const auto step = [](int64_t l) { return std::max<int64_t>(1, l / 10); };
    if (attempt(layers)) {
      while (trials < s.max_trials && attempt(layers + step(layers))) layers += step(layers);
    } else if (!below_best) {
      while (trials < s.max_trials) {
        layers -= step(layers);
        if (layers < 1 || params_of(layers) <= best.params) break;
        if (attempt(layers)) break;
      }
    }
    // Halve the gap between the largest success and the smallest failure.
    while (trials < s.max_trials && ok_layers > 0 && failed_layers > ok_layers + 1) {
      const int64_t mid = (ok_layers + failed_layers) / 2;
      // A model no larger than the best (at another hidden size) cannot
      // win whether it trains or not.
      if (params_of(mid) <= best.params) {
        ok_layers = mid;
        continue;
      }
      attempt(mid);
    }
  }
  best.seconds = Seconds(started);
  return best;
}

// --- 2. Traffic. ---

struct TrafficRow {
  double budget_fraction = 0;
  uint64_t budget_bytes = 0;
  // Host<->device bytes per steady step.
  std::optional<uint64_t> static_bytes;
  std::optional<uint64_t> auto_bytes;
  // Host<->disk bytes (read and written) per steady step.
  std::optional<uint64_t> static_disk_bytes;
  std::optional<uint64_t> auto_disk_bytes;
  // What auto's plan predicted.
  std::optional<uint64_t> planned_bytes;
  // Blocks each policy recomputed in its last step.
  int static_recomputed_blocks = 0;
  int auto_recomputed_blocks = 0;
  // Why a policy could not train at this budget.
  std::string static_error, auto_error;
  uint64_t bound_bytes = 0;
};

// Mean bytes moved per steady step (the first two steps, warm-up and the
// step that brings pinned chunks in, left out): host<->device, or with
// `disk` host<->disk.
std::optional<uint64_t> SteadyTraffic(const Trial& t, bool disk = false) {
  if (!t.status.ok()) return std::nullopt;
  uint64_t bytes = 0;
  int steps = 0;
  for (size_t s = kFirstSteadyStep; s < t.observer.reports.size(); ++s) {
    const StepMemoryStats& m = t.observer.reports[s].memory_stats;
    bytes += disk ? m.disk_to_host_bytes + m.host_to_disk_bytes : m.host_to_device_bytes + m.device_to_host_bytes;
    ++steps;
  }
  return steps > 0 ? bytes / static_cast<uint64_t>(steps) : 0;
}

// A lower bound on host<->device traffic for a placement whose optimizer
// runs on the host for what the device does not keep (fp32): a parameter
// stays put only with its weights, gradients and moments (16 B) on the
// device beside the step's activations; every other parameter must at least
// bring its weights in and send its gradients out once a step (8 B). The
// activations counted are the least this engine's step holds (every block
// recomputing), so no recompute choice gets under it.
uint64_t WeightsAndGradientsBound(int64_t params, uint64_t budget, uint64_t least_non_model) {
  const double room = budget > least_non_model ? double(budget - least_non_model) : 0.0;
  const double resident = std::min(double(params), room / kBytesPerParam);
  return static_cast<uint64_t>(8.0 * (double(params) - resident));
}

uint64_t PeakNonModel(const Trial& t) {
  uint64_t peak = 0;
  for (const StepReport& r : t.observer.reports) peak = std::max(peak, r.memory_stats.peak_non_model_bytes);
  return peak;
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
  const auto started = std::chrono::steady_clock::now();

  // 1. Capacity, bf16.
  const uint64_t device_budget = quick ? 128 * kMiB : 512 * kMiB;
  const uint64_t host_budget = quick ? 1024 * kMiB : 6144 * kMiB;
  const uint64_t disk_budget = absl::GetFlag(FLAGS_disk_budget_mib) > 0
                                   ? static_cast<uint64_t>(absl::GetFlag(FLAGS_disk_budget_mib)) * kMiB
                                   : (quick ? 4 : 24) * kGiB;
  const std::string disk_dir = absl::GetFlag(FLAGS_disk_dir);
  const int64_t vocab = quick ? 2048 : 8192, seq = quick ? 64 : 128, batch = 1;
  const std::vector<int64_t> hiddens = quick ? std::vector<int64_t>{512} : std::vector<int64_t>{1024, 1536};
  std::fprintf(stderr, "capacity (bf16): device %lu MiB, host %lu MiB, disk %lu MiB in %s\n", device_budget / kMiB,
               host_budget / kMiB, disk_budget / kMiB, disk_dir.c_str());
  std::vector<CapacitySetup> setups(3);
  setups[0].name = "static";
  setups[0].policy = MemoryOptions::Policy::kStatic;
  setups[1].name = "auto";
  setups[2].name = "auto_disk";
  setups[2].disk_budget = disk_budget;
  setups[2].disk_dir = disk_dir;
  for (CapacitySetup& s : setups) {
    s.device_budget = device_budget;
    s.host_budget = host_budget;
    s.hiddens = hiddens;
    s.max_trials = 4;
  }
  // A failure there is mostly the tier plan's refusal, before any step.
  setups[2].max_trials = 5;
  // A disk trial of a billion-parameter model takes minutes here: one
  // hidden size.
  setups[2].hiddens = {hiddens.front()};
  std::vector<CapacityResult> caps;
  for (const CapacitySetup& s : setups) caps.push_back(Capacity(s, vocab, seq, batch));
  auto budgets = [&](const CapacitySetup& s) { return double(s.device_budget + s.host_budget + s.disk_budget); };
  std::vector<double> ratios;
  for (size_t i = 0; i < setups.size(); ++i) ratios.push_back(double(caps[i].params) * kBytesPerParam / budgets(setups[i]));
  const CapacityResult& disk_cap = caps[2];
  const double disk_used_ratio =
      double(disk_cap.params) * kBytesPerParam / double(device_budget + host_budget + disk_cap.disk_bytes);

  // 2. Traffic, for one model at fractions of its model data (fp32).
  // Short sequences: model data, not activations, should fill the device.
  const ModelConfig traffic_model = quick ? Model(4, 256, 4096, 64) : Model(8, 512, 8192, 64);
  const int64_t traffic_batch = 2;
  const int64_t traffic_steps = quick ? 5 : 6;
  const int64_t n = traffic_model.ParameterCount();
  const uint64_t model_data = static_cast<uint64_t>(double(n) * kBytesPerParam);
  std::fprintf(stderr, "traffic: %lld parameters, %.1f MiB of model data\n", static_cast<long long>(n),
               double(model_data) / kMiB);
  // The step's activations, measured with room to spare: as trained (auto
  // recomputes nothing there after the warm-up), and the least, with every
  // block recomputing.
  const uint64_t peak_non_model = PeakNonModel(*TrainOnSimulatedDevice(
      traffic_model, 3, traffic_batch, 64 * model_data, Policy(MemoryOptions::Policy::kAuto, 0)));
  MemoryOptions recompute_all = Policy(MemoryOptions::Policy::kAuto, 0);
  recompute_all.recompute = MemoryOptions::Recompute::kAll;
  const uint64_t least_non_model =
      PeakNonModel(*TrainOnSimulatedDevice(traffic_model, 3, traffic_batch, 64 * model_data, recompute_all));
  std::vector<TrafficRow> traffic;
  for (double fraction : {0.25, 0.5, 0.75, 1.0}) {
    TrafficRow row;
    row.budget_fraction = fraction;
    row.budget_bytes = static_cast<uint64_t>(fraction * double(model_data));
    std::unique_ptr<Trial> st = TrainOnSimulatedDevice(traffic_model, traffic_steps, traffic_batch, row.budget_bytes,
                                                       Policy(MemoryOptions::Policy::kStatic, 0));
    row.static_bytes = SteadyTraffic(*st);
    row.static_disk_bytes = SteadyTraffic(*st, true);
    if (!st->status.ok()) row.static_error = std::string(st->status.message()).substr(0, 160);
    if (st->status.ok() && !st->observer.reports.empty()) {
      row.static_recomputed_blocks =
          static_cast<int>(st->observer.reports.back().memory_stats.recomputed_stages.size());
    }
    std::unique_ptr<Trial> a = TrainOnSimulatedDevice(traffic_model, traffic_steps, traffic_batch, row.budget_bytes,
                                                      Policy(MemoryOptions::Policy::kAuto, 0));
    row.auto_bytes = SteadyTraffic(*a);
    row.auto_disk_bytes = SteadyTraffic(*a, true);
    if (!a->status.ok()) row.auto_error = std::string(a->status.message()).substr(0, 160);
    row.planned_bytes = a->status.ok() ? std::optional<uint64_t>(a->observer.placement.planned_traffic_bytes)
                                       : std::nullopt;
    if (a->status.ok() && !a->observer.reports.empty()) {
      row.auto_recomputed_blocks = static_cast<int>(a->observer.reports.back().memory_stats.recomputed_stages.size());
    }
    row.bound_bytes = WeightsAndGradientsBound(n, row.budget_bytes, least_non_model);
    std::fprintf(stderr, "  %.0f%%: static %s MiB, auto %s MiB (planned %s), bound %.1f MiB\n", 100 * fraction,
                 Mb(row.static_bytes).c_str(), Mb(row.auto_bytes).c_str(), Mb(row.planned_bytes).c_str(),
                 double(row.bound_bytes) / kMiB);
    if (!row.static_error.empty()) std::fprintf(stderr, "    static: %s\n", row.static_error.c_str());
    if (!row.auto_error.empty()) std::fprintf(stderr, "    auto: %s\n", row.auto_error.c_str());
    traffic.push_back(row);
  }
  bool any_disk = false;
  for (const TrafficRow& r : traffic) {
    any_disk = any_disk || r.static_disk_bytes.value_or(0) > 0 || r.auto_disk_bytes.value_or(0) > 0;
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
  std::printf("\nCapacity, bf16 (device %lu MiB, host %lu MiB, disk %lu MiB; vocab %lld, seq %lld, batch %lld)\n",
              device_budget / kMiB, host_budget / kMiB, disk_budget / kMiB, static_cast<long long>(vocab),
              static_cast<long long>(seq), static_cast<long long>(batch));
  std::printf("%-10s %14s %8s %8s %8s %7s %9s %10s %10s\n", "policy", "parameters", "layers", "hidden", "ratio",
              "trials", "search s", "host peak", "disk");
  for (size_t i = 0; i < setups.size(); ++i) {
    const CapacityResult& c = caps[i];
    std::printf("%-10s %14lld %8lld %8lld %8.3f %7d %9.0f %10s %10s\n", setups[i].name.c_str(),
                static_cast<long long>(c.params), static_cast<long long>(c.layers), static_cast<long long>(c.hidden),
                ratios[i], c.trials, c.seconds, absl::StrFormat("%.2f GiB", double(c.host_peak_bytes) / kGiB).c_str(),
                absl::StrFormat("%.2f GiB", double(c.disk_bytes) / kGiB).c_str());
  }
  std::printf("(ratio: parameters x 16 B / (device + host budget [+ disk budget given]))\n");
  std::printf("auto trains %.2fx the parameters of static, auto with disk %.2fx\n",
              caps[0].params > 0 ? double(caps[1].params) / double(caps[0].params) : 0.0,
              caps[0].params > 0 ? double(caps[2].params) / double(caps[0].params) : 0.0);
  std::printf("auto_disk: %d of %d chunks with gradients or states on disk, %.2f GiB read and %.2f GiB written a steady step "
              "(planned %.2f / %.2f), %.1f s a step; ratio over the disk bytes used %.3f\n",
              disk_cap.disk_chunks, disk_cap.chunks, double(disk_cap.disk_read_bytes) / kGiB,
              double(disk_cap.disk_write_bytes) / kGiB, double(disk_cap.planned_disk_read_bytes) / kGiB,
              double(disk_cap.planned_disk_write_bytes) / kGiB, disk_cap.step_seconds, disk_used_ratio);

  std::printf("\nTraffic per steady step, fp32 (%lld parameters, %.1f MiB of model data, peak activations %.1f MiB, "
              "%.1f MiB with every block recomputing)\n",
              static_cast<long long>(n), double(model_data) / kMiB, double(peak_non_model) / kMiB,
              double(least_non_model) / kMiB);
  std::printf("%-7s %10s %10s %10s %10s %12s %10s %10s%s\n", "budget", "budget", "static", "auto", "planned",
              "recomputed", "bound", "auto/bound", any_disk ? "  disk static/auto" : "");
  auto ratio = [](const std::optional<uint64_t>& a, uint64_t b) {
    return a && b > 0 ? absl::StrFormat("%.2f", double(*a) / double(b)) : std::string("-");
  };
  for (const TrafficRow& r : traffic) {
    std::printf("%-7s %10.1f %10s %10s %10s %12s %10.1f %10s%s\n",
                absl::StrFormat("%.0f%%", 100 * r.budget_fraction).c_str(), double(r.budget_bytes) / kMiB,
                Mb(r.static_bytes).c_str(), Mb(r.auto_bytes).c_str(), Mb(r.planned_bytes).c_str(),
                absl::StrFormat("%d / %d", r.static_recomputed_blocks, r.auto_recomputed_blocks).c_str(),
                double(r.bound_bytes) / kMiB, ratio(r.auto_bytes, r.bound_bytes).c_str(),
                any_disk ? absl::StrCat("  ", Mb(r.static_disk_bytes), " / ", Mb(r.auto_disk_bytes)).c_str() : "");
  }
  std::printf("(MiB host<->device per steady step; recomputed: blocks static / auto recomputed; bound: weights in and\n"
              " gradients out for every parameter that cannot keep its 16 B on the device beside the least\n"
              " activations; %s)\n",
              any_disk ? "disk: MiB read and written on disk per steady step" : "no row uses the disk tier");
  std::printf("\nOverhead with an ample budget: plain %.4f s/step, auto %.4f s/step, ratio %.3f\n", plain_seconds,
              auto_seconds, plain_seconds > 0 ? auto_seconds / plain_seconds : 0.0);
  const double total_seconds = Seconds(started);
  std::printf("\n%.0f s in all\n", total_seconds);

  // JSON.
  std::vector<std::string> rows;
  for (const TrafficRow& r : traffic) {
    rows.push_back(absl::StrFormat(
        "    {\"budget_fraction\": %.2f, \"budget_bytes\": %d, \"static_bytes\": %s, \"auto_bytes\": %s, "
        "\"auto_planned_bytes\": %s, \"weights_and_gradients_bound_bytes\": %d, \"static_disk_bytes\": %s, "
        "\"auto_disk_bytes\": %s, \"static_recomputed_blocks\": %d, \"auto_recomputed_blocks\": %d, \"static_error\": %s, \"auto_error\": %s}",
        r.budget_fraction, r.budget_bytes, Opt(r.static_bytes), Opt(r.auto_bytes), Opt(r.planned_bytes),
        r.bound_bytes, Opt(r.static_disk_bytes), Opt(r.auto_disk_bytes), r.static_recomputed_blocks, r.auto_recomputed_blocks,
        JsonString(r.static_error), JsonString(r.auto_error)));
  }
  auto column = [&](size_t i) {
    const CapacityResult& c = caps[i];
    std::vector<std::string> quoted;
    for (const std::string& line : c.log) quoted.push_back(JsonString(line));
    return absl::StrCat(
        "    ", JsonString(setups[i].name), ": {\"params\": ", c.params, ", \"layers\": ", c.layers,
        ", \"hidden\": ", c.hidden, ", \"ratio\": ", absl::StrFormat("%.4f", ratios[i]),
        ", \"disk_budget_bytes\": ", setups[i].disk_budget, ", \"host_peak_bytes\": ", c.host_peak_bytes,
        ", \"planned_host_bytes\": ", c.planned_host_bytes, ", \"chunks\": ", c.chunks,
        ", \"disk_chunks\": ", c.disk_chunks, ", \"disk_bytes\": ", c.disk_bytes,
        ", \"disk_read_bytes_per_step\": ", c.disk_read_bytes, ", \"disk_write_bytes_per_step\": ",
        c.disk_write_bytes, ", \"planned_disk_read_bytes_per_step\": ", c.planned_disk_read_bytes,
        ", \"planned_disk_write_bytes_per_step\": ", c.planned_disk_write_bytes, ", \"step_seconds\": ",
        absl::StrFormat("%.3f", c.step_seconds), ", \"search_seconds\": ", absl::StrFormat("%.1f", c.seconds),
        ", \"trials\": [", absl::StrJoin(quoted, ", "), "]}");
  };
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"memory\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(), ",\n  \"seconds\": ",
      absl::StrFormat("%.0f", total_seconds),
      ",\n  \"capacity\": {\n    \"precision\": \"bf16\",\n    \"device_budget_bytes\": ", device_budget,
      ",\n    \"host_budget_bytes\": ", host_budget, ",\n    \"disk_budget_bytes\": ", disk_budget,
      ",\n    \"ratio_denominator\": \"device + host budget, + disk budget given for auto_disk\"",
      ",\n    \"vocab_size\": ", vocab, ", \"seq_len\": ", seq, ", \"batch_size\": ", batch, ", \"steps\": 3",
      ",\n", column(0), ",\n", column(1), ",\n", column(2), ",\n    \"auto_disk_ratio_over_disk_used\": ",
      absl::StrFormat("%.4f", disk_used_ratio), "\n  },\n",
      "  \"traffic_model\": {\"params\": ", n, ", \"model_data_bytes\": ", model_data, ", \"precision\": \"fp32\"",
      ", \"peak_non_model_bytes\": ", peak_non_model, ", \"least_non_model_bytes\": ", least_non_model,
      "},\n  \"traffic\": [\n", absl::StrJoin(rows, ",\n"),
      "\n  ],\n  \"overhead\": {\"plain_seconds\": ", absl::StrFormat("%.6f", plain_seconds),
      ", \"auto_seconds\": ", absl::StrFormat("%.6f", auto_seconds), ", \"ratio\": ",
      absl::StrFormat("%.4f", plain_seconds > 0 ? auto_seconds / plain_seconds : 0.0), "}\n}\n");
  return ferry::WriteBenchResult("memory", absl::GetFlag(FLAGS_out), json);
}
