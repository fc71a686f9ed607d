// Training throughput of the engine on this machine: tokens per second and
// step time for small GPT presets at 1 and 2 CPU threads, all in one run.
//
//   bazel run //bench:train_bench [-- --quick]
//
// Writes bench/results/train_bench.json and prints a table. Figures only;
// nothing here passes or fails on time.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/bench_output.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/common/host_info.h"
#include "engine/data/synthetic_source.h"
#include "engine/device/device.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/model_config.h"
#include "engine/train/trainer.h"

ABSL_FLAG(bool, quick, false, "Fewer steps (under a minute).");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/train_bench.json).");

namespace {

// Keeps the step times after the first (warm-up) steps.
class Timer : public ferry::TrainingObserver {
 public:
  explicit Timer(int64_t skip) : skip_(skip) {}
  void OnStep(const ferry::StepReport& r) override {
    last_loss = r.loss;
    if (r.step <= skip_) return;
    seconds += r.step_seconds;
    tokens += r.tokens_per_second * r.step_seconds;
    ++steps;
  }
  double seconds = 0, tokens = 0, last_loss = 0;
  int64_t steps = 0;

 private:
  int64_t skip_;
};

struct Result {
  std::string preset;
  int threads;
  int64_t parameters;
  int64_t batch_tokens;
  double step_seconds;
  double tokens_per_second;
  double final_loss;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int64_t steps = quick ? 12 : 40;
  const int64_t warmup = 2;
  const int max_threads = std::min(2, ferry::HostCpuCount());

  std::vector<Result> results;
  for (const char* preset : {"gpt2-tiny", "gpt2-mini"}) {
    for (int threads = 1; threads <= max_threads; ++threads) {
      ferry::ModelConfig model = *ferry::ModelPreset(preset);
      ferry::TrainOptions options;
      options.steps = steps;
      options.batch_size = 8;
      options.lr = 1e-3;
      options.min_lr = 1e-4;
      options.warmup_steps = 2;
      options.threads = threads;
      Timer timer(warmup);
      // The plain LibTorch loop: the engine's raw speed, without placement.
      ferry::SimulatedDevice device(ferry::HostMemoryTotalBytes() / 2);
      ferry::EngineOptions engine;
      engine.device = &device;
      engine.memory = std::nullopt;
      ferry::Trainer trainer(model, options, engine,
                             std::make_unique<ferry::SyntheticSource>(model.vocab_size, 2, 1, 1), &timer);
      if (absl::Status s = trainer.Run(); !s.ok()) {
        std::fprintf(stderr, "train_bench: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      results.push_back({preset, threads, model.ParameterCount(), options.batch_size * model.seq_len,
                         timer.seconds / double(timer.steps), timer.tokens / timer.seconds,
                         timer.last_loss});
      std::fprintf(stderr, "  %s, %d thread(s): done\n", preset, threads);
    }
  }

  std::printf("\n%-10s %7s %10s %12s %12s %12s\n", "preset", "threads", "params", "tokens/step",
              "s/step", "tokens/s");
  std::vector<std::string> rows;
  for (const Result& r : results) {
    std::printf("%-10s %7d %10lld %12lld %12.4f %12.0f\n", r.preset.c_str(), r.threads,
                static_cast<long long>(r.parameters), static_cast<long long>(r.batch_tokens),
                r.step_seconds, r.tokens_per_second);
    rows.push_back(absl::StrFormat(
        "    {\"preset\": \"%s\", \"threads\": %d, \"parameters\": %d, \"batch_tokens\": %d, "
        "\"step_seconds\": %.6f, \"tokens_per_second\": %.1f, \"final_loss\": %.4f}",
        r.preset, r.threads, r.parameters, r.batch_tokens, r.step_seconds, r.tokens_per_second,
        r.final_loss));
  }
  // Thread scaling, measured in this run: 2 threads against 1.
  std::vector<std::string> scaling;
  for (size_t i = 0; i + 1 < results.size(); ++i) {
    if (results[i].preset == results[i + 1].preset && results[i].threads == 1) {
      const double ratio = results[i + 1].tokens_per_second / results[i].tokens_per_second;
      std::printf("%s: 2 threads give %.2fx the tokens/s of 1\n", results[i].preset.c_str(), ratio);
      scaling.push_back(absl::StrFormat("\"%s\": %.3f", results[i].preset, ratio));
    }
  }
  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"train_bench\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"cpu\",\n  \"torch_version\": \"", ferry::TorchVersion(),
      "\",\n  \"host_cpus\": ", ferry::HostCpuCount(), ",\n  \"measured_steps\": ", steps - warmup,
      ",\n  \"results\": [\n", absl::StrJoin(rows, ",\n"),
      "\n  ],\n  \"two_thread_speedup\": {", absl::StrJoin(scaling, ", "), "}\n}\n");

  return ferry::WriteBenchResult("train_bench", absl::GetFlag(FLAGS_out), json);
}
