// Activation recomputation, measured in one run on the simulated device: a
// 12-layer GPT at sequence length 512 trained with memory.recompute none and
// all on an ample device, and auto on a device too small to keep every
// block's activations. For each: the peak non-model device memory of a
// steady step (activations and workspace), the median steady step time and
// the blocks that recompute. The runs alternate over rounds so that drift in
// the machine's speed hits each alike.
//
//   bazel run //bench:recompute [-- --quick]
//
// Writes bench/results/recompute.json and prints a table. Figures only;
// nothing here passes or fails.
//
// The other way to a smaller activation peak, gradient accumulation:
//
//   bazel run //bench:recompute -- --accumulation
//
// trains GPT-2 small (seq 256, batch 8) for two steps with
// train.grad_accum_steps 1 and 4 on an ample simulated device and writes the
// steps' peak non-model device memory (StepReport's activation figure) to
// bench/results/accumulation.json.

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
#include "bench/sim_trial.h"
#include "engine/common/host_info.h"
#include "engine/memory/placement_plan.h"
#include "engine/memory/placement_report.h"
#include "engine/model/model_config.h"

ABSL_FLAG(bool, quick, false, "A narrower model, a smaller batch and fewer steps (under two minutes).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/recompute.json).");
ABSL_FLAG(bool, accumulation, false,
          "Instead: GPT-2 small's activation peak with train.grad_accum_steps 1 and 4 (two steps each).");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kAmple = uint64_t{64} << 30;

std::unique_ptr<Trial> Train(const ModelConfig& model, int64_t steps, int64_t batch, uint64_t device_bytes,
                             MemoryOptions::Recompute mode) {
  MemoryOptions memory;
  memory.recompute = mode;
  return TrainOnSimulatedDevice(model, steps, batch, device_bytes, memory);
}

// What one mode measured, over every round.
struct ModeResult {
  std::string name;
  MemoryOptions::Recompute mode;
  uint64_t device_bytes = 0;
  uint64_t peak_bytes = 0;             // steady steps, largest over rounds
  std::vector<double> step_seconds;    // steady steps, every round
  std::vector<int> recomputed_blocks;  // in the last steady step
  std::string error;

  double MedianSeconds() const { return Median(step_seconds); }
};

void Record(const Trial& t, ModeResult* r) {
  if (!t.status.ok()) {
    r->error = std::string(t.status.message()).substr(0, 240);
    return;
  }
  const std::vector<StepReport>& reports = t.observer.reports;
  for (size_t s = kFirstSteadyStep; s < reports.size(); ++s) {
    r->peak_bytes = std::max(r->peak_bytes, reports[s].memory_stats.peak_non_model_bytes);
  }
  const std::vector<double> seconds = SteadyStepSeconds(reports);
  r->step_seconds.insert(r->step_seconds.end(), seconds.begin(), seconds.end());
  if (!reports.empty()) r->recomputed_blocks = reports.back().recomputed_blocks;
}

// The device the step needs with every chunk streamed: the busiest
// period's non-model memory beside that period's chunks, over the margin.
uint64_t StreamedNeed(const PlacementReport& report, double margin) {
  const PlanInput in = PlanInputFromReport(report, UINT64_MAX);
  const Plan plan = EvaluatePlan(in, std::vector<ChunkClass>(in.param_bytes.size(), ChunkClass::kStreamed));
  return static_cast<uint64_t>(double(plan.binding_need()) / (1.0 - margin));
}

std::string Blocks(const std::vector<int>& blocks) { return absl::StrJoin(blocks, ","); }

// GPT-2 small, seq 256, batch 8: the activation peak per step with the batch
// whole and as 4 micro-batches.
int AccumulationBench() {
  ModelConfig model;
  model.layers = 12;
  model.hidden = 768;
  model.heads = 12;
  model.vocab_size = 50257;
  model.seq_len = 256;
  model.dropout = 0.0;
  const int64_t batch = 8, steps = 2;
  std::vector<std::string> rows;
  std::printf("\nGradient accumulation: GPT-2 small, seq %lld, batch %lld (simulated device, %lld steps)\n",
              static_cast<long long>(model.seq_len), static_cast<long long>(batch), static_cast<long long>(steps));
  std::printf("%-16s %16s %16s %12s\n", "grad_accum_steps", "peak act. MiB", "peak device MiB", "s/step");
  for (int64_t k : {int64_t{1}, int64_t{4}}) {
    std::unique_ptr<Trial> t =
        TrainOnSimulatedDevice(model, steps, batch, kAmple, MemoryOptions(), TrainOptions::Precision::kFp32, k);
    uint64_t activation = 0, device = 0;
    std::vector<std::string> per_step;
    for (const StepReport& r : t->observer.reports) {
      for (const MemoryUsage& m : r.memory) {
        if (m.tier == "device" && m.kind == "activation") activation = std::max<uint64_t>(activation, m.bytes);
      }
      device = std::max<uint64_t>(device, r.device_memory_bytes);
      per_step.push_back(absl::StrFormat("{\"step\": %d, \"activation_bytes\": %d, \"device_bytes\": %d, "
                                         "\"step_seconds\": %.3f}",
                                         r.step, r.memory_stats.peak_non_model_bytes, r.device_memory_bytes,
                                         r.step_seconds));
    }
    const double seconds = t->observer.reports.empty() ? 0 : t->observer.reports.back().step_seconds;
    std::printf("%-16lld %16.1f %16.1f %12.1f%s\n", static_cast<long long>(k), double(activation) / kMiB,
                double(device) / kMiB, seconds,
                t->status.ok() ? "" : (" error: " + std::string(t->status.message())).c_str());
    rows.push_back(absl::StrFormat("    {\"grad_accum_steps\": %d, \"peak_activation_bytes\": %d, "
                                   "\"peak_device_bytes\": %d, \"steps\": [%s], \"error\": %s}",
                                   k, activation, device, absl::StrJoin(per_step, ", "),
                                   JsonString(std::string(t->status.message()))));
  }
  std::printf("(peak act.: the step's peak non-model device memory, as StepReport reports it)\n");
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"accumulation\",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(),
      ",\n  \"model\": {\"preset\": \"gpt2-small\", \"seq_len\": ", model.seq_len, ", \"params\": ",
      model.ParameterCount(), "},\n  \"batch_size\": ", batch, ",\n  \"runs\": [\n", absl::StrJoin(rows, ",\n"),
      "\n  ]\n}\n");
  return WriteBenchResult("accumulation", "", json);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  using R = MemoryOptions::Recompute;
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_accumulation)) return AccumulationBench();
  const bool quick = absl::GetFlag(FLAGS_quick);

  ModelConfig model;
  model.layers = 12;
  model.seq_len = 512;
  model.hidden = quick ? 128 : 256;
  model.heads = quick ? 2 : 4;
  model.vocab_size = 1024;
  model.dropout = 0.1;
  const int64_t batch = quick ? 2 : 4;
  const int64_t steps = quick ? 5 : 8;
  const int rounds = 2;
  std::fprintf(stderr, "recompute: %lld layers, hidden %lld, seq %lld, batch %lld, %lld parameters\n",
               static_cast<long long>(model.layers), static_cast<long long>(model.hidden),
               static_cast<long long>(model.seq_len), static_cast<long long>(batch),
               static_cast<long long>(model.ParameterCount()));

  // The budget for auto: halfway between what the step needs with every
  // block recomputing and with none, chunks streamed in both: too small to
  // keep every block's activations, ample for keeping some.
  const double margin = MemoryOptions().margin;
  std::unique_ptr<Trial> keep = Train(model, 2, batch, kAmple, R::kNone);
  std::unique_ptr<Trial> drop = Train(model, 2, batch, kAmple, R::kAll);
  if (!keep->status.ok() || !drop->status.ok()) {
    std::fprintf(stderr, "recompute: sizing runs failed: %s %s\n", keep->status.ToString().c_str(),
                 drop->status.ToString().c_str());
    return 1;
  }
  const uint64_t need_none = StreamedNeed(keep->observer.placement, margin);
  const uint64_t need_all = StreamedNeed(drop->observer.placement, margin);
  const uint64_t auto_budget = (need_none + need_all) / 2;
  std::fprintf(stderr, "  device needed, chunks streamed: %.1f MiB keeping every block, %.1f MiB recomputing all; "
               "auto gets %.1f MiB\n", double(need_none) / kMiB, double(need_all) / kMiB,
               double(auto_budget) / kMiB);

  std::vector<ModeResult> results = {{"none", R::kNone, kAmple}, {"all", R::kAll, kAmple},
                                     {"auto", R::kAuto, auto_budget}};
  for (int round = 0; round < rounds; ++round) {
    for (ModeResult& r : results) {
      std::unique_ptr<Trial> t = Train(model, steps, batch, r.device_bytes, r.mode);
      Record(*t, &r);
      std::fprintf(stderr, "  round %d %-4s: %s\n", round + 1, r.name.c_str(),
                   t->status.ok() ? absl::StrFormat("%.3f s/step, blocks [%s]", r.MedianSeconds(),
                                                    Blocks(r.recomputed_blocks))
                                        .c_str()
                                  : r.error.c_str());
    }
  }

  const ModeResult& none = results[0];
  auto peak_cut = [&](const ModeResult& r) { return r.peak_bytes > 0 ? double(none.peak_bytes) / r.peak_bytes : 0; };
  auto time_ratio = [&](const ModeResult& r) {
    return none.MedianSeconds() > 0 ? r.MedianSeconds() / none.MedianSeconds() : 0;
  };
  std::printf("\nRecompute: %lld-layer GPT, hidden %lld, seq %lld, batch %lld, dropout %.1f (simulated device)\n",
              static_cast<long long>(model.layers), static_cast<long long>(model.hidden),
              static_cast<long long>(model.seq_len), static_cast<long long>(batch), model.dropout);
  std::printf("%-5s %12s %12s %10s %10s %10s  %s\n", "mode", "device MiB", "peak MiB", "peak cut", "s/step",
              "time", "recomputed blocks");
  for (const ModeResult& r : results) {
    std::printf("%-5s %12s %12.1f %9.2fx %10.3f %9.2fx  %s%s\n", r.name.c_str(),
                r.device_bytes == kAmple ? "ample" : absl::StrFormat("%.1f", double(r.device_bytes) / kMiB).c_str(),
                double(r.peak_bytes) / kMiB, peak_cut(r), r.MedianSeconds(), time_ratio(r),
                Blocks(r.recomputed_blocks).c_str(), r.error.empty() ? "" : (" error: " + r.error).c_str());
  }
  std::printf("(peak: non-model device memory of a steady step; cut and time against none, same run)\n");

  std::vector<std::string> modes;
  for (const ModeResult& r : results) {
    modes.push_back(absl::StrFormat(
        "  \"%s\": {\"device_bytes\": %d, \"peak_bytes\": %d, \"step_seconds\": %.6f, \"peak_cut\": %.4f, "
        "\"time_ratio\": %.4f, \"recomputed_blocks\": [%s], \"error\": %s}",
        r.name, r.device_bytes, r.peak_bytes, r.MedianSeconds(), peak_cut(r), time_ratio(r),
        Blocks(r.recomputed_blocks), JsonString(r.error)));
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"recompute\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(), ",\n  \"model\": {\"layers\": ", model.layers,
      ", \"hidden\": ", model.hidden, ", \"heads\": ", model.heads, ", \"vocab_size\": ", model.vocab_size,
      ", \"seq_len\": ", model.seq_len, ", \"dropout\": ", model.dropout, ", \"params\": ",
      model.ParameterCount(), "},\n  \"batch_size\": ", batch, ",\n  \"steady_steps_per_round\": ", steps - 2,
      ",\n  \"rounds\": ", rounds, ",\n  \"streamed_need_none_bytes\": ", need_none,
      ",\n  \"streamed_need_all_bytes\": ", need_all, ",\n", absl::StrJoin(modes, ",\n"), "\n}\n");
  return WriteBenchResult("recompute", absl::GetFlag(FLAGS_out), json);
}
