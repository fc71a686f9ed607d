// The device checks: the memory manager's contract on a real device, run
// by tools/gpu/check.sh on a GPU (--device=cuda) and in CI on the simulated
// device (--device=cpu --quick), so the checks themselves never rot. In one
// run:
//   budget_cap     the device holds allocations to the job's budget, and
//                  its out-of-memory error names the numbers;
//   moves          under a tight budget, the bytes the manager says it moved
//                  are the bytes the device copied (each direction), beside
//                  the plan's traffic;
//   overlap        the device-timed copy time against the time compute
//                  stood waiting for copies (CUDA events on a GPU), and the
//                  prefetch hits;
//   oom_message    a budget too small for one step fails naming the period,
//                  the numbers and memory.device_budget;
//   train_vs_cpu   GPT losses on the device against the same training on
//                  the simulated device (the CPU), fp32 and bf16, within a
//                  stated tolerance;
//   capped         the seed's claim: a model too large for a capped device
//                  in bf16 -- GPT-2 XL at 6 GiB on a GPU -- fails under
//                  static placement and trains under auto, with tokens/s and
//                  MFU capped and uncapped.
// Writes JSON (--out, default bench/results/device_check.json) and a table;
// exits 1 if a check's correctness condition fails. Rates are figures,
// never conditions.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_output.h"
#include "bench/sim_trial.h"
#include "engine/common/host_info.h"
#include "engine/device/device.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/placement_plan.h"
#include "engine/memory/placement_report.h"
#include "engine/model/model_config.h"

ABSL_FLAG(std::string, device, "auto", "auto, cpu (the simulated device) or cuda[:N].");
ABSL_FLAG(bool, quick, false, "Small models and budgets (the simulated device in CI).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/device_check.json).");
ABSL_FLAG(std::string, capped_preset, "gpt2-xl", "The model of the capped check (not --quick).");
ABSL_FLAG(int64_t, capped_seq_len, 1024, "Its sequence length (batch 1).");
ABSL_FLAG(std::string, capped_budget, "6GiB", "Its device budget, e.g. 6GiB (the seed's RTX 2060 laptop).");
ABSL_FLAG(double, peak_tflops, 0, "The device's bf16 dense peak for MFU (0: the measured bf16 GEMM rate).");
ABSL_FLAG(int64_t, steps, 4, "Steps of the capped runs, the warm-up included.");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string Mib(uint64_t b) { return absl::StrFormat("%.1f MiB", double(b) / double(kMiB)); }

// Forwards to a device, counting the bytes copied each way.
class CountingDevice final : public MemoryDevice {
 public:
  explicit CountingDevice(MemoryDevice* inner) : inner_(inner) {}
  std::string name() const override { return inner_->name(); }
  c10::Device compute_device() const override { return inner_->compute_device(); }
  uint64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  uint64_t allocated_bytes() const override { return inner_->allocated_bytes(); }
  uint64_t peak_allocated_bytes() const override { return inner_->peak_allocated_bytes(); }
  void ResetPeak() override { inner_->ResetPeak(); }
  c10::DataPtr AllocateDevice(size_t bytes) override { return inner_->AllocateDevice(bytes); }
  c10::DataPtr ReleasedPlaceholder(size_t bytes) override { return inner_->ReleasedPlaceholder(bytes); }
  at::Tensor AllocateHost(int64_t numel, c10::ScalarType dtype) override { return inner_->AllocateHost(numel, dtype); }
  TransferEvent CopyToDevice(const at::Tensor& host, const at::Tensor& device, const TransferEvent& after) override {
    to_device += static_cast<uint64_t>(host.numel()) * host.element_size();
    return inner_->CopyToDevice(host, device, after);
  }
  TransferEvent CopyToHost(const at::Tensor& device, const at::Tensor& host, const TransferEvent& after) override {
    to_host += static_cast<uint64_t>(device.numel()) * device.element_size();
    return inner_->CopyToHost(device, host, after);
  }
  void ComputeWaitsFor(const TransferEvent& event) override { inner_->ComputeWaitsFor(event); }
  void SynchronizeTransfers() override { inner_->SynchronizeTransfers(); }
  void ReleaseAfterTransfers(c10::DataPtr data, size_t bytes) override {
    inner_->ReleaseAfterTransfers(std::move(data), bytes);
  }
  uint64_t releasing_bytes() const override { return inner_->releasing_bytes(); }
  void ReleaseCachedMemory() override { inner_->ReleaseCachedMemory(); }
  uint64_t unusable_bytes() const override { return inner_->unusable_bytes(); }
  TransferTimes TakeTransferTimes() override { return inner_->TakeTransferTimes(); }
  void ComputeBegins() override { inner_->ComputeBegins(); }

  uint64_t to_device = 0, to_host = 0;

 private:
  MemoryDevice* inner_;
};

struct Check {
  std::string name;
  bool ok = false;
  std::string summary;  // one line for the table
  std::string json;     // its figures, "key": value, ...
};

std::unique_ptr<MemoryDevice> Device(uint64_t budget) {
  absl::StatusOr<std::unique_ptr<MemoryDevice>> d = MakeMemoryDevice(absl::GetFlag(FLAGS_device), budget);
  if (!d.ok()) {
    std::fprintf(stderr, "device_check: %s\n", std::string(d.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(d);
}

// On the device under check, with every core.
std::unique_ptr<Trial> Train(MemoryDevice* device, const ModelConfig& model, int64_t steps, int64_t batch,
                             TrainOptions::Precision precision, std::optional<MemoryOptions> memory) {
  return TrainOn(device, model, steps, batch, memory, precision, /*grad_accum_steps=*/1, HostCpuCount());
}

Check BudgetCap(bool quick) {
  Check c;
  c.name = "budget_cap";
  const uint64_t budget = quick ? 64 * kMiB : 1024 * kMiB;
  const uint64_t block = quick ? 4 * kMiB : 64 * kMiB;
  std::unique_ptr<MemoryDevice> device = Device(budget);
  const uint64_t device_capacity = device->capacity_bytes();
  std::vector<c10::DataPtr> held;
  std::string error;
  const uint64_t before = device->allocated_bytes();
  try {
    for (int i = 0; i < 4096; ++i) held.push_back(device->AllocateDevice(block));
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  const uint64_t allocated = device->allocated_bytes() - before;
  held.clear();
  device->ReleaseCachedMemory();
  // A host copy takes the memory asked for, no more (a caching host
  // allocator would round a 369 MB chunk up to 512 MiB); page-locked memory
  // is resident at once.
  const int64_t host_numel = quick ? (16 << 20) : 369'000'000 / 4;
  const uint64_t rss_before = ProcessResidentBytes();
  at::Tensor host = device->AllocateHost(host_numel, at::kFloat);
  const uint64_t rss_after = ProcessResidentBytes();
  const uint64_t host_bytes = static_cast<uint64_t>(host_numel) * 4;
  const uint64_t host_growth = rss_after > rss_before ? rss_after - rss_before : 0;
  host = at::Tensor();
  // Without a budget: the memory free now, not the device's total.
  const uint64_t free_now = DeviceMemoryFreeBytes(device->compute_device());
  device.reset();
  const uint64_t uncapped = Device(0)->capacity_bytes();
  const bool is_gpu = !Device(0)->compute_device().is_cpu();
  c.ok = device_capacity <= budget && allocated <= device_capacity && !error.empty() &&
         error.find("MiB") != std::string::npos && host_growth <= host_bytes + host_bytes / 10 + 16 * kMiB &&
         (!is_gpu || uncapped <= free_now + 64 * kMiB);
  c.summary = absl::StrCat("capacity ", Mib(device_capacity), " of a ", Mib(budget), " budget; ", Mib(allocated),
                           " allocated before the refusal; a ", Mib(host_bytes), " host copy grew the process by ",
                           Mib(host_growth), "; uncapped ", Mib(uncapped), " (", Mib(free_now), " free)");
  c.json = absl::StrCat("\"budget_bytes\": ", budget, ", \"capacity_bytes\": ", device_capacity,
                        ", \"allocated_bytes\": ", allocated, ", \"error\": ", JsonString(error.substr(0, 400)),
                        ", \"host_copy_bytes\": ", host_bytes, ", \"host_copy_resident_growth_bytes\": ", host_growth,
                        ", \"uncapped_capacity_bytes\": ", uncapped, ", \"free_bytes\": ", free_now);
  return c;
}

ModelConfig Small(bool quick) {
  ModelConfig model = *ModelPreset(quick ? "gpt2-mini" : "gpt2-small");
  model.seq_len = quick ? 64 : 256;
  model.dropout = 0;
  return model;
}

uint64_t StreamedNeed(const PlacementReport& r) {
  const PlanInput in = PlanInputFromReport(r, UINT64_MAX);
  Plan plan = EvaluatePlan(in, std::vector<ChunkClass>(in.param_bytes.size(), ChunkClass::kStreamed));
  return plan.binding_need();
}

// The moves and overlap checks, from one tight run.
std::vector<Check> MovesAndOverlap(bool quick) {
  const ModelConfig model = Small(quick);
  const int64_t batch = quick ? 4 : 8, steps = 6;
  uint64_t need = 0;
  {
    std::unique_ptr<MemoryDevice> ample = Device(0);
    std::unique_ptr<Trial> probe = Train(ample.get(), model, 2, batch, TrainOptions::Precision::kFp32, MemoryOptions());
    if (probe->status.ok()) need = StreamedNeed(probe->observer.placement);
  }
  std::unique_ptr<MemoryDevice> inner = Device(need * 6 / 5);
  CountingDevice device(inner.get());
  std::unique_ptr<Trial> run = Train(&device, model, steps, batch, TrainOptions::Precision::kFp32, MemoryOptions());
  const std::vector<StepReport>& r = run->observer.reports;
  // From the whole run: the device's counts cover every step.
  uint64_t said_in = 0, said_out = 0, planned = 0, steady_moved = 0;
  double copy = 0, stall = 0;
  int hits = 0, misses = 0, retries = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const StepMemoryStats& s = r[i].memory_stats;
    said_in += s.host_to_device_bytes;
    said_out += s.device_to_host_bytes;
    retries += s.allocation_retries;
    if (i < kFirstSteadyStep) continue;
    steady_moved += s.host_to_device_bytes + s.device_to_host_bytes;
    copy += s.copy_seconds;
    stall += s.transfer_seconds;
    hits += s.prefetch_hits;
    misses += s.prefetch_misses;
  }
  planned = run->observer.placement.planned_traffic_bytes;
  const size_t steady = r.size() > kFirstSteadyStep ? r.size() - kFirstSteadyStep : 1;
  Check moves;
  moves.name = "moves";
  moves.ok = run->status.ok() && need > 0 && said_in == device.to_device && said_out == device.to_host &&
             steady_moved > 0;
  moves.summary = absl::StrCat(run->status.ok() ? "" : absl::StrCat("FAILED: ", run->status.message(), "; "),
                               "said ", Mib(said_in), " in / ", Mib(said_out), " out, the device copied ",
                               Mib(device.to_device), " / ", Mib(device.to_host), "; ", Mib(steady_moved / steady),
                               " a steady step, planned ", Mib(planned));
  moves.json = absl::StrCat("\"budget_bytes\": ", need * 6 / 5, ", \"said_to_device_bytes\": ", said_in,
                            ", \"said_to_host_bytes\": ", said_out, ", \"copied_to_device_bytes\": ",
                            device.to_device, ", \"copied_to_host_bytes\": ", device.to_host,
                            ", \"steady_moved_bytes_per_step\": ", steady_moved / steady,
                            ", \"planned_traffic_bytes_per_step\": ", planned, ", \"allocation_retries\": ", retries);
  Check overlap;
  overlap.name = "overlap";
  overlap.ok = run->status.ok() && hits > 0;
  const double hidden = copy > 0 ? std::max(0.0, 1.0 - stall / copy) : 0.0;
  overlap.summary = absl::StrFormat("copies %.3f s, compute waited %.3f s (%.0f%% of copy time hidden); %d prefetch "
                                    "hits, %d misses",
                                    copy, stall, 100 * hidden, hits, misses);
  overlap.json = absl::StrFormat(
      "\"copy_seconds\": %.6f, \"exposed_transfer_seconds\": %.6f, \"hidden_fraction\": %.4f, \"prefetch_hits\": %d, "
      "\"prefetch_misses\": %d",
      copy, stall, hidden, hits, misses);
  return {moves, overlap};
}

Check OomMessage(bool quick) {
  Check c;
  c.name = "oom_message";
  const ModelConfig model = Small(quick);
  std::unique_ptr<MemoryDevice> device = Device(quick ? 4 * kMiB : 64 * kMiB);
  MemoryOptions memory;
  memory.policy = MemoryOptions::Policy::kStatic;
  std::unique_ptr<Trial> run = Train(device.get(), model, 2, 8, TrainOptions::Precision::kFp32, memory);
  const std::string message(run->status.message());
  c.ok = !run->status.ok() && message.find("out of device memory") != std::string::npos &&
         message.find("memory.device_budget") != std::string::npos && message.find("MiB") != std::string::npos;
  c.summary = message.substr(0, 160);
  c.json = absl::StrCat("\"error\": ", JsonString(message.substr(0, 600)));
  return c;
}

Check TrainVsCpu(bool quick) {
  Check c;
  c.name = "train_vs_cpu";
  // Small enough that the CPU's run is short on any machine.
  ModelConfig model = Small(/*quick=*/true);
  const int64_t steps = quick ? 6 : 12, batch = 4;
  struct Type {
    const char* name;
    TrainOptions::Precision precision;
    double tolerance;
  };
  const Type types[] = {{"fp32", TrainOptions::Precision::kFp32, 1e-3}, {"bf16", TrainOptions::Precision::kBf16, 3e-2}};
  c.ok = true;
  for (const Type& t : types) {
    std::vector<double> on_device, on_cpu;
    {
      std::unique_ptr<MemoryDevice> device = Device(0);
      std::unique_ptr<Trial> run = Train(device.get(), model, steps, batch, t.precision, MemoryOptions());
      if (!run->status.ok()) c.summary += absl::StrCat(t.name, " FAILED: ", run->status.message(), "; ");
      for (const StepReport& s : run->observer.reports) on_device.push_back(s.loss);
    }
    {
      SimulatedDevice cpu(HostMemoryTotalBytes() / 4);
      std::unique_ptr<Trial> run = Train(&cpu, model, steps, batch, t.precision, MemoryOptions());
      for (const StepReport& s : run->observer.reports) on_cpu.push_back(s.loss);
    }
    double worst = on_device.size() == on_cpu.size() && !on_cpu.empty() ? 0 : INFINITY;
    for (size_t i = 0; i < std::min(on_device.size(), on_cpu.size()); ++i) {
      worst = std::max(worst, std::abs(on_device[i] - on_cpu[i]) / std::abs(on_cpu[i]));
    }
    c.ok = c.ok && worst <= t.tolerance;
    c.summary += absl::StrFormat("%s: worst relative loss difference %.2e (tolerance %.0e) over %d steps; ", t.name,
                                 worst, t.tolerance, int(steps));
    c.json += absl::StrFormat("%s\"%s\": {\"worst_relative\": %.3e, \"tolerance\": %.0e, \"device\": %s, \"cpu\": %s}",
                              c.json.empty() ? "" : ", ", t.name, worst, t.tolerance, JsonList(on_device),
                              JsonList(on_cpu));
  }
  return c;
}

uint64_t ParseBytes(const std::string& s) {
  double value = 0;
  char unit[8] = {0};
  if (std::sscanf(s.c_str(), "%lf%7s", &value, unit) < 1) return 0;
  const std::string u(unit);
  const double scale = u == "GiB" ? 1024.0 * kMiB : u == "MiB" ? double(kMiB) : 1.0;
  return static_cast<uint64_t>(value * scale);
}

Check Capped(bool quick) {
  Check c;
  c.name = "capped";
  ModelConfig model = *ModelPreset(quick ? "gpt2-small" : absl::GetFlag(FLAGS_capped_preset));
  model.seq_len = quick ? 32 : absl::GetFlag(FLAGS_capped_seq_len);
  const uint64_t budget = quick ? 256 * kMiB : ParseBytes(absl::GetFlag(FLAGS_capped_budget));
  const int64_t steps = quick ? 3 : absl::GetFlag(FLAGS_steps);
  const c10::Device compute = Device(0)->compute_device();
  double peak = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  const bool measured_peak = peak <= 0;
  if (measured_peak) peak = MeasureMatmulFlops(compute, at::kBFloat16, quick ? 512 : 8192);
  struct Result {
    std::string status;
    bool ok = false;
    double step_seconds = 0, tokens_per_second = 0, mfu = 0;
  };
  auto run = [&](uint64_t cap, MemoryOptions::Policy policy) {
    Result r;
    std::unique_ptr<MemoryDevice> device = Device(cap);
    MemoryOptions memory;
    memory.policy = policy;
    memory.recompute = policy == MemoryOptions::Policy::kAuto ? MemoryOptions::Recompute::kAuto
                                                              : MemoryOptions::Recompute::kNone;
    std::unique_ptr<Trial> t = Train(device.get(), model, steps, 1, TrainOptions::Precision::kBf16, memory);
    r.ok = t->status.ok();
    r.status = r.ok ? "trained" : std::string(t->status.message());
    const double median = Median(SteadyStepSeconds(t->observer.reports));
    if (r.ok && median > 0) {
      r.step_seconds = median;
      r.tokens_per_second = double(model.seq_len) / median;
      r.mfu = 6.0 * double(model.ParameterCount()) * r.tokens_per_second / peak;
    }
    return r;
  };
  const Result static_capped = run(budget, MemoryOptions::Policy::kStatic);
  const Result auto_capped = run(budget, MemoryOptions::Policy::kAuto);
  const Result auto_uncapped = run(0, MemoryOptions::Policy::kAuto);
  c.ok = !static_capped.ok && auto_capped.ok && auto_uncapped.ok;
  const std::string model_name = quick ? "gpt2-small" : absl::GetFlag(FLAGS_capped_preset);
  c.summary = absl::StrFormat(
      "%s bf16 seq %d at %s: static %s; auto %.0f tokens/s (MFU %.3f), uncapped %.0f tokens/s (MFU %.3f)",
      model_name, int(model.seq_len), Mib(budget), static_capped.ok ? "TRAINED" : "fails", auto_capped.tokens_per_second,
      auto_capped.mfu, auto_uncapped.tokens_per_second, auto_uncapped.mfu);
  auto json = [](const Result& r) {
    return absl::StrFormat("{\"ok\": %s, \"status\": %s, \"step_seconds\": %.4f, \"tokens_per_second\": %.2f, "
                           "\"mfu\": %.4f}",
                           r.ok ? "true" : "false", JsonString(r.status.substr(0, 400)), r.step_seconds,
                           r.tokens_per_second, r.mfu);
  };
  c.json = absl::StrFormat(
      "\"model\": %s, \"parameters\": %d, \"seq_len\": %d, \"budget_bytes\": %d, \"peak_flops\": %.4g, "
      "\"peak_measured\": %s, \"static_capped\": %s, \"auto_capped\": %s, \"auto_uncapped\": %s",
      JsonString(model_name), model.ParameterCount(), model.seq_len, budget, peak, measured_peak ? "true" : "false",
      json(static_capped), json(auto_capped), json(auto_uncapped));
  return c;
}

int Main() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  std::vector<Check> checks;
  auto add = [&](Check c) {
    std::printf("%-13s %-4s %s\n", c.name.c_str(), c.ok ? "ok" : "FAIL", c.summary.c_str());
    std::fflush(stdout);
    checks.push_back(std::move(c));
  };
  const std::string device = Device(0)->name();
  std::printf("device checks on %s%s\n", device.c_str(), quick ? " (quick)" : "");
  add(BudgetCap(quick));
  for (Check& c : MovesAndOverlap(quick)) add(std::move(c));
  add(OomMessage(quick));
  add(TrainVsCpu(quick));
  add(Capped(quick));
  bool all = true;
  std::string json = absl::StrCat("{\n  \"device\": ", JsonString(device), ",\n  \"torch\": ", JsonString(TorchVersion()),
                                  ",\n  \"quick\": ", quick ? "true" : "false", ",\n  \"checks\": {");
  for (size_t i = 0; i < checks.size(); ++i) {
    all = all && checks[i].ok;
    absl::StrAppend(&json, i == 0 ? "\n" : ",\n", "    ", JsonString(checks[i].name), ": {\"ok\": ",
                    checks[i].ok ? "true" : "false", ", ", checks[i].json, "}");
  }
  absl::StrAppend(&json, "\n  },\n  \"ok\": ", all ? "true" : "false", "\n}\n");
  const int written = WriteBenchResult("device_check", absl::GetFlag(FLAGS_out), json);
  return all && written == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Main();
}
