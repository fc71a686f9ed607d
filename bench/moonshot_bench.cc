// GPT-2 XL on a machine without a GPU: the three tiers at the scale they are
// for. The preset gpt2-xl (1.56 B parameters; sequence length 256, batch 1,
// bf16, recompute auto) trains on the simulated device with a 1 GiB device
// budget, a 12 GiB host budget and the disk tier under --disk_dir, for
// --steps steps; the first is the warm-up. Reports the losses, the median
// step time after the warm-up and where it went, the process's peak resident
// memory, host and disk bytes for model data, and disk traffic per step
// against the plan's prediction. The checkpoint after the last step but one
// is streamed to --checkpoint_dir (the host budget has no room for a
// snapshot), and a second run resumes from it and trains the last step
// again: how long saving, verifying and restoring took, the peak memory
// with them, and whether the last step came out bit for bit the same.
//
//   bazel run -c opt //bench:moonshot [-- --quick] [--disk_dir=DIR] [--host_budget_gib=G]
//
// --quick (under three minutes) trains a small GPT whose host budget is
// below its model data, so the disk tier is used all the same, and writes
// the same keys. Writes bench/results/moonshot.json (moonshot_quick.json
// with --quick) and prints a table. Figures only; nothing here passes or
// fails.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
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
#include "engine/checkpoint/async_writer.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/common/status_macros.h"
#include "engine/common/host_info.h"
#include "engine/model/model_config.h"

ABSL_FLAG(bool, quick, false, "A small GPT with a host budget below its model data (under three minutes).");
ABSL_FLAG(int64_t, steps, 5, "Steps to train, the warm-up included.");
ABSL_FLAG(std::string, disk_dir, "/var/tmp/ferry-moonshot", "Directory for the disk tier's chunk files.");
ABSL_FLAG(double, host_budget_gib, 12, "memory.host_budget of the GPT-2 XL run, in GiB; other than 12, the results "
          "go to moonshot_hostNg.json (N the budget).");
ABSL_FLAG(int64_t, grad_accum_steps, 1,
          "train.grad_accum_steps: a batch of this many sequences, one per micro-batch; other than 1, the results go "
          "to moonshot_accumN.json (N the micro-batches) and no checkpoint is taken.");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/moonshot.json).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Where the checkpoint after the last step but one is streamed and resumed from (default: a directory "
          "beside the disk tier, removed at the end).");

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// The kernel's high-water mark of this process's resident memory.
uint64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

class Progress : public Collector {
 public:
  void OnStep(const StepReport& r) override {
    Collector::OnStep(r);
    std::printf("  step %lld/%lld: loss %.4f, %.1f s (forward %.1f, backward %.1f, optimizer %.1f; disk wait %.1f, "
                "transfer %.1f; %.2f GiB read, %.2f GiB written)\n",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss, r.step_seconds,
                r.times.forward, r.times.backward, r.times.optimizer, r.times.disk, r.memory_stats.transfer_seconds,
                double(r.memory_stats.disk_to_host_bytes) / kGiB, double(r.memory_stats.host_to_disk_bytes) / kGiB);
    std::fflush(stdout);
  }
  void OnLog(LogLevel, const std::string& message) override {
    std::printf("  %s\n", message.c_str());
    std::fflush(stdout);
  }
};

// A Markov chain over the first 1024 tokens: a model that learns which
// tokens occur at all shows it within a few steps.
std::unique_ptr<TokenSource> Data(const ModelConfig& model) {
  return std::make_unique<SyntheticSource>(std::min<int64_t>(model.vocab_size, 1024), 2, 1, 1);
}

int Run() {
  const bool quick = absl::GetFlag(FLAGS_quick);
  ModelConfig model;
  uint64_t device_bytes = kGiB;
  uint64_t host_budget = static_cast<uint64_t>(absl::GetFlag(FLAGS_host_budget_gib) * double(kGiB));
  const int64_t micro_batches = std::max<int64_t>(1, absl::GetFlag(FLAGS_grad_accum_steps));
  // Accumulation is about the step, not the checkpoint: those runs take none.
  const bool checkpoints = micro_batches == 1;
  std::string name = quick ? std::string("moonshot_quick")
                     : host_budget == 12 * kGiB
                         ? std::string("moonshot")
                         : absl::StrFormat("moonshot_host%gg", absl::GetFlag(FLAGS_host_budget_gib));
  if (micro_batches > 1) absl::StrAppend(&name, "_accum", micro_batches);
  if (quick) {
    model.layers = 8;
    model.hidden = 512;
    model.heads = 8;
    model.vocab_size = 8192;
    model.seq_len = 128;
    device_bytes = 128 * kMiB;
    // A little over half its 16 bytes a parameter: most optimizer states
    // must go to disk.
    host_budget = static_cast<uint64_t>(model.ParameterCount()) * 16 / 20 * 11;
  } else {
    absl::StatusOr<ModelConfig> preset = ModelPreset("gpt2-xl");
    if (!preset.ok()) {
      std::fprintf(stderr, "moonshot: %s\n", std::string(preset.status().message()).c_str());
      return 1;
    }
    model = *preset;
    model.seq_len = 256;
  }
  model.dropout = 0;
  // The small model shows its losses falling over a few more steps.
  const int64_t steps = std::max<int64_t>(quick ? 8 : 2, absl::GetFlag(FLAGS_steps));
  MemoryOptions memory;
  memory.host_budget_bytes = host_budget;
  memory.disk_dir = absl::GetFlag(FLAGS_disk_dir);
  memory.disk_budget_bytes = 200 * kGiB;
  memory.recompute = MemoryOptions::Recompute::kAuto;

  std::printf("moonshot: %lld parameters (%d layers, hidden %lld, vocab %lld, seq %lld), bf16, "
              "batch %lld, one sequence a micro-batch; device %.0f MiB, host budget %.2f GiB, disk tier in %s\n",
              static_cast<long long>(model.ParameterCount()), static_cast<int>(model.layers),
              static_cast<long long>(model.hidden), static_cast<long long>(model.vocab_size),
              static_cast<long long>(model.seq_len), static_cast<long long>(micro_batches), double(device_bytes) / kMiB, double(host_budget) / kGiB,
              memory.disk_dir.c_str());
  std::fflush(stdout);

  // The checkpoint after the last step but one: streamed (the host budget
  // has no room for a snapshot of the state) and then resumed from, for the
  // last step again.
  std::string checkpoint_root = absl::GetFlag(FLAGS_checkpoint_dir);
  const bool own_checkpoint_root = checkpoint_root.empty();
  if (own_checkpoint_root) {
    const std::string base = memory.disk_dir.empty() ? std::string("/tmp") : memory.disk_dir;
    checkpoint_root = absl::StrCat(base, "/ferry-moonshot-checkpoint-", getpid());
  }
  CheckpointWriteResult saved;
  bool streamed = false;
  AsyncCheckpointWriter writer([&](const CheckpointContents& c) { return WriteCheckpoint(checkpoint_root, c, 1); },
                               [&](const CheckpointWriteResult& r) { saved = r; });

  Progress observer;
  absl::Status status;
  TrainOptions train;
  {
    SimulatedDevice device(device_bytes);
    train.steps = steps;
    train.batch_size = micro_batches;
    train.grad_accum_steps = micro_batches;
    train.lr = quick ? 1e-3 : 6e-4;
    train.min_lr = train.lr / 10;
    train.warmup_steps = 1;
    train.precision = TrainOptions::Precision::kBf16;
    EngineOptions engine;
    engine.device = &device;
    engine.memory = memory;
    engine.checkpoint_every_steps = steps - 1;
    if (checkpoints) engine.on_checkpoint = [&](CheckpointContents c, double seconds) -> absl::Status {
      if (c.step != steps - 1) return absl::OkStatus();
      streamed = !c.produced.empty();
      std::printf("  checkpoint of step %lld: %s\n", static_cast<long long>(c.step),
                  streamed ? "streaming to disk" : "a snapshot in memory");
      std::fflush(stdout);
      RETURN_IF_ERROR(writer.Submit(std::move(c), seconds));
      return writer.Wait();
    };
    status = Trainer(model, train, engine, Data(model), &observer).Run();
  }
  const uint64_t peak_rss = PeakResidentBytes();
  if (!status.ok()) std::printf("moonshot: training failed: %s\n", std::string(status.message()).c_str());

  // Resume from it and train the last step again.
  double load_seconds = 0, resume_seconds = 0;
  absl::Status resume_status = !checkpoints ? absl::CancelledError("no checkpoint in an accumulation run")
                               : status.ok()  ? saved.status
                                              : status;
  Progress resumed;
  if (resume_status.ok()) {
    const auto load_start = std::chrono::steady_clock::now();
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpointAt(checkpoint_root, steps - 1);
    load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    resume_status = loaded.status();
    if (loaded.ok()) {
      std::printf("  checkpoint verified in %.1f s; resuming\n", load_seconds);
      std::fflush(stdout);
      SimulatedDevice device(device_bytes);
      EngineOptions engine;
      engine.device = &device;
      engine.memory = memory;
      engine.resume = &loaded->contents;
      const auto start = std::chrono::steady_clock::now();
      resume_status = Trainer(model, train, engine, Data(model), &resumed).Run();
      const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      resume_seconds = total - (resumed.reports.empty() ? 0 : resumed.reports.back().step_seconds);
    }
  }
  if (!resume_status.ok()) std::printf("moonshot: resuming failed: %s\n", std::string(resume_status.message()).c_str());
  const uint64_t peak_rss_with_resume = PeakResidentBytes();
  if (own_checkpoint_root) std::filesystem::remove_all(checkpoint_root);
  const bool resumed_same = resume_status.ok() && resumed.reports.size() == 1 && !observer.reports.empty() &&
                            resumed.reports[0].loss == observer.reports.back().loss &&
                            resumed.reports[0].grad_norm == observer.reports.back().grad_norm;

  const std::vector<StepReport>& r = observer.reports;
  std::vector<double> losses, seconds, compute, optimizer, disk, transfer;
  uint64_t read = 0, written = 0, host_peak = 0, host_bytes = 0, disk_bytes = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    losses.push_back(r[i].loss);
    host_peak = std::max(host_peak, r[i].memory_stats.peak_host_model_bytes);
    if (i == 0) continue;  // the warm-up
    const StepSplit split = SplitOf(r[i]);
    seconds.push_back(r[i].step_seconds);
    compute.push_back(split.compute);
    optimizer.push_back(split.optimizer);
    disk.push_back(split.exposed_disk);
    transfer.push_back(split.exposed_transfer);
    read = r[i].memory_stats.disk_to_host_bytes;
    written = r[i].memory_stats.host_to_disk_bytes;
  }
  if (!r.empty()) {
    const StepMemoryStats& last = r.back().memory_stats;
    host_bytes = last.host_model_bytes;
    for (int k = 0; k < 3; ++k) disk_bytes += last.disk_bytes[k];
  }
  const PlacementReport& placement = observer.placement;
  const double params = double(model.ParameterCount());
  const uint64_t capacity = device_bytes + host_budget + disk_bytes;

  std::printf("\n%-34s %s\n", "parameters", absl::StrFormat("%.0f", params).c_str());
  std::printf("%-34s %s\n", "losses", absl::StrJoin(losses, ", ", [](std::string* o, double x) {
                absl::StrAppend(o, absl::StrFormat("%.4f", x));
              }).c_str());
  std::printf("%-34s %.1f s\n", "step (median after warm-up)", Median(seconds));
  std::printf("%-34s compute %.1f s, optimizer %.1f s, exposed disk %.1f s, exposed transfer %.1f s\n",
              "where a step went (medians)", Median(compute), Median(optimizer), Median(disk), Median(transfer));
  std::printf("%-34s %.2f GiB\n", "peak RSS of the process", double(peak_rss) / kGiB);
  std::printf("%-34s %.2f GiB peak (%.2f B a parameter), %.2f GiB planned\n", "host memory for model data",
              double(host_peak) / kGiB, double(host_peak) / params, double(placement.planned_host_bytes) / kGiB);
  std::printf("%-34s %.2f GiB\n", "disk tier", double(disk_bytes) / kGiB);
  std::printf("%-34s read %.2f GiB, written %.2f GiB; planned %.2f / %.2f GiB\n", "disk traffic per step",
              double(read) / kGiB, double(written) / kGiB, double(placement.planned_disk_read_bytes) / kGiB,
              double(placement.planned_disk_write_bytes) / kGiB);
  std::printf("%-34s %.2f\n", "capacity ratio 16 P / (D + H + K)", params * 16 / double(capacity));
  std::printf("%-34s %s, %.2f GiB in %.1f s (training waited %.1f s)\n", "checkpoint of the last step but one",
              streamed ? "streamed" : "snapshot", double(saved.bytes) / kGiB, saved.total_seconds,
              saved.blocked_seconds);
  std::printf("%-34s verified in %.1f s, restored (model built and state read) in %.1f s; last step %s\n",
              "resume", load_seconds, resume_seconds,
              resumed_same ? "bit for bit the same" : "DIFFERENT or not run");
  std::printf("%-34s %.2f GiB\n", "peak RSS, with the resume", double(peak_rss_with_resume) / kGiB);

  std::string json = absl::StrCat(
      "{\n  \"model\": ", JsonString(quick ? "quick" : "gpt2-xl"), ",\n  \"params\": ",
      absl::StrFormat("%.0f", params), ",\n  \"seq_len\": ", model.seq_len, ",\n  \"batch\": ", micro_batches, ",\n  \"grad_accum_steps\": ", micro_batches,
      ",\n  \"precision\": \"bf16\",\n  \"device_budget_bytes\": ", device_bytes, ",\n  \"host_budget_bytes\": ",
      host_budget, ",\n  \"ok\": ", status.ok() ? "true" : "false", ",\n  \"error\": ",
      JsonString(std::string(status.message())), ",\n  \"steps\": ", r.size(), ",\n  \"losses\": ", JsonList(losses),
      ",\n  \"step_seconds\": ", absl::StrFormat("%.3f", Median(seconds)), ",\n  \"step_seconds_all\": ",
      JsonList(seconds), ",\n  \"step_split\": {\"compute\": ", absl::StrFormat("%.3f", Median(compute)),
      ", \"optimizer\": ", absl::StrFormat("%.3f", Median(optimizer)),
      ", \"exposed_disk\": ", absl::StrFormat("%.3f", Median(disk)),
      ", \"exposed_transfer\": ", absl::StrFormat("%.3f", Median(transfer)), "}",
      ",\n  \"peak_rss_bytes\": ", peak_rss, ",\n  \"host_bytes\": ", host_peak,
      ",\n  \"host_bytes_at_end\": ", host_bytes, ",\n  \"host_bytes_per_param\": ",
      absl::StrFormat("%.3f", double(host_peak) / params), ",\n  \"planned_host_bytes\": ",
      placement.planned_host_bytes, ",\n  \"disk_bytes\": ", disk_bytes, ",\n  \"disk_read_bytes_per_step\": ", read,
      ",\n  \"disk_write_bytes_per_step\": ", written, ",\n  \"planned_disk_read_bytes_per_step\": ",
      placement.planned_disk_read_bytes, ",\n  \"planned_disk_write_bytes_per_step\": ",
      placement.planned_disk_write_bytes, ",\n  \"capacity_ratio\": ",
      absl::StrFormat("%.3f", params * 16 / double(capacity)), ",\n  \"host_memory_bytes\": ",
      HostMemoryTotalBytes(), ",\n  \"cpus\": ", HostCpuCount(),
      ",\n  \"checkpoint\": {\"step\": ", steps - 1, ", \"streamed\": ", streamed ? "true" : "false",
      ", \"ok\": ", saved.status.ok() && status.ok() ? "true" : "false", ", \"bytes\": ", saved.bytes,
      ", \"seconds\": ", absl::StrFormat("%.3f", saved.total_seconds), ", \"blocked_seconds\": ",
      absl::StrFormat("%.3f", saved.blocked_seconds), "}",
      ",\n  \"resume\": {\"ok\": ", resume_status.ok() ? "true" : "false", ", \"error\": ",
      JsonString(std::string(resume_status.message())), ", \"verify_seconds\": ",
      absl::StrFormat("%.3f", load_seconds), ", \"restore_seconds\": ", absl::StrFormat("%.3f", resume_seconds),
      ", \"last_step_bitwise_equal\": ", resumed_same ? "true" : "false",
      ", \"peak_rss_bytes\": ", peak_rss_with_resume, "}\n}\n");
  return WriteBenchResult(name, absl::GetFlag(FLAGS_out), json);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
