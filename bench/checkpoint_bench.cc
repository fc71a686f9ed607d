// Checkpoints of a GPT of about 100M parameters (12 layers, hidden 768,
// vocabulary 16384), trained two steps on the simulated device with the
// memory manager, checkpointed after the second the way ferry-worker does it
// (a snapshot at the step boundary, then the write on a background thread),
// and loaded back into a fresh trainer. Measures:
//
//   bytes                  the checkpoint on disk (every file, MANIFEST too)
//   save_blocking_seconds  what the step loop waited: the snapshot (state
//                          copied to host memory as bytes)
//   save_total_seconds     snapshot + write + fsync + rename + keep-N
//   load_seconds           LoadLatestCheckpoint (read, CRC-32 check) plus
//                          restoring the state into a new trainer
//
// The files are written under --dir (default $TMPDIR or /tmp) and removed
// afterwards; before loading, their pages are dropped from the page cache
// (posix_fadvise), so the load reads the disk as after a restart.
//
//   bazel run //bench:checkpoint [-- --quick]
//
// Writes bench/results/checkpoint.json and prints a table. Figures only;
// nothing here passes or fails.

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_output.h"
#include "engine/checkpoint/async_writer.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/common/host_info.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/model/model_config.h"
#include "engine/train/trainer.h"

ABSL_FLAG(bool, quick, false, "A model of about 17M parameters instead of 100M (well under a minute).");
ABSL_FLAG(std::string, dir, "", "Where to write the checkpoint (default $TMPDIR or /tmp); removed afterwards.");
ABSL_FLAG(std::string, out, "", "JSON output path (default bench/results/checkpoint.json).");

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kDevice = uint64_t{16} << 30;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Step times, and when the trainer finished building its chunks and when it
// started training: restoring a checkpoint happens between the two.
class Timings : public TrainingObserver {
 public:
  void OnStep(const StepReport& r) override { step_seconds.push_back(r.step_seconds); }
  void OnLog(LogLevel, const std::string& message) override {
    if (message.rfind("memory:", 0) == 0) chunks_ready = Clock::now();
  }
  void OnStarted(const TrainingStarted&) override { started = Clock::now(); }
  std::vector<double> step_seconds;
  Clock::time_point chunks_ready, started;
};

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  return names;
}

// Every file's size under `dir` (one level); with `drop`, their pages
// leave the page cache.
uint64_t FilesBytes(const std::string& dir, bool drop) {
  uint64_t total = 0;
  for (const std::string& n : List(dir)) {
    const std::string path = dir + "/" + n;
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    total += static_cast<uint64_t>(st.st_size);
    if (drop) {
      const int fd = open(path.c_str(), O_RDONLY);
      if (fd >= 0) {
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
      }
    }
  }
  return total;
}

void RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& n : List(path)) RemoveTree(path + "/" + n);
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

std::string FileSystemName(const std::string& path) {
  struct statfs fs;
  if (statfs(path.c_str(), &fs) != 0) return "unknown";
  switch (static_cast<uint64_t>(fs.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    default: return absl::StrFormat("0x%x", static_cast<uint64_t>(fs.f_type));
  }
}

TrainOptions Options(int64_t steps) {
  TrainOptions train;
  train.steps = steps;
  train.batch_size = 1;
  train.lr = 1e-4;
  train.min_lr = 1e-5;
  train.warmup_steps = 1;
  return train;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);

  ModelConfig model;
  model.layers = quick ? 4 : 12;
  model.hidden = quick ? 512 : 768;
  model.heads = quick ? 8 : 12;
  model.vocab_size = quick ? 8192 : 16384;
  model.seq_len = 128;
  model.dropout = 0.0;
  const int64_t steps = 2;
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string tmpl = base + "/ferry-checkpoint-bench.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "checkpoint: cannot create a directory under %s\n", base.c_str());
    return 1;
  }
  const std::string root = tmpl + "/rank0";
  std::fprintf(stderr, "checkpoint: %lld layers, hidden %lld, vocab %lld: %lld parameters; writing under %s (%s)\n",
               static_cast<long long>(model.layers), static_cast<long long>(model.hidden),
               static_cast<long long>(model.vocab_size), static_cast<long long>(model.ParameterCount()),
               tmpl.c_str(), FileSystemName(tmpl).c_str());

  // Train, checkpointing after the last step as ferry-worker does.
  absl::Mutex mu;
  CheckpointWriteResult saved;
  Timings train_timings;
  absl::Status trained;
  {
    AsyncCheckpointWriter writer([&](const CheckpointContents& c) { return WriteCheckpoint(root, c, 2); },
                                 [&](const CheckpointWriteResult& r) {
                                   absl::MutexLock lock(&mu);
                                   saved = r;
                                 });
    SimulatedDevice device(kDevice);
    EngineOptions engine;
    engine.device = &device;
    engine.checkpoint_every_steps = steps;
    engine.on_checkpoint = [&](CheckpointContents c, double snapshot_seconds) {
      return writer.Submit(std::move(c), snapshot_seconds);
    };
    trained = Trainer(model, Options(steps), engine, std::make_unique<SyntheticSource>(model.vocab_size, 2, 1, 1),
                      &train_timings)
                  .Run();
    if (absl::Status s = writer.Wait(); trained.ok()) trained = s;
  }
  if (!trained.ok() || !saved.status.ok()) {
    std::fprintf(stderr, "checkpoint: training or saving failed: %s %s\n", trained.ToString().c_str(),
                 saved.status.ToString().c_str());
    RemoveTree(tmpl);
    return 1;
  }
  const std::string step_dir = absl::StrFormat("%s/step-%012d", root, steps);
  const uint64_t bytes = FilesBytes(step_dir, /*drop=*/true);
  std::fprintf(stderr, "  saved %.1f MiB: blocked %.3f s, total %.3f s\n", double(bytes) / kMiB,
               saved.blocked_seconds, saved.total_seconds);

  // Load it into a fresh trainer: read and verify, then restore.
  const Clock::time_point read_start = Clock::now();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root);
  const double read_seconds = Since(read_start);
  if (!loaded.ok()) {
    std::fprintf(stderr, "checkpoint: loading failed: %s\n", loaded.status().ToString().c_str());
    RemoveTree(tmpl);
    return 1;
  }
  Timings load_timings;
  absl::Status restored;
  {
    SimulatedDevice device(kDevice);
    EngineOptions engine;
    engine.device = &device;
    engine.resume = &loaded->contents;
    // As many steps as the checkpoint has: restore, train none.
    restored = Trainer(model, Options(steps), engine,
                       std::make_unique<SyntheticSource>(model.vocab_size, 2, 1, 1), &load_timings)
                   .Run();
  }
  RemoveTree(tmpl);
  if (!restored.ok()) {
    std::fprintf(stderr, "checkpoint: restoring failed: %s\n", restored.ToString().c_str());
    return 1;
  }
  const double restore_seconds =
      std::chrono::duration<double>(load_timings.started - load_timings.chunks_ready).count();
  const double load_seconds = read_seconds + restore_seconds;
  const double step_seconds = train_timings.step_seconds.empty() ? 0 : train_timings.step_seconds.back();

  std::printf("\nCheckpoint: %lld-layer GPT, hidden %lld, vocab %lld, %lld parameters (fp32, AdamW; simulated "
              "device, %d CPUs)\n",
              static_cast<long long>(model.layers), static_cast<long long>(model.hidden),
              static_cast<long long>(model.vocab_size), static_cast<long long>(model.ParameterCount()),
              HostCpuCount());
  std::printf("%-34s %12.1f MiB (%.2f bytes/parameter)\n", "size on disk", double(bytes) / kMiB,
              double(bytes) / double(model.ParameterCount()));
  std::printf("%-34s %12.3f s\n", "save: training blocked (snapshot)", saved.blocked_seconds);
  std::printf("%-34s %12.3f s\n", "save: total (+ write, fsync)", saved.total_seconds);
  std::printf("%-34s %12.3f s  (read + CRC-32 %.3f s, restore %.3f s)\n", "load", load_seconds, read_seconds,
              restore_seconds);
  std::printf("%-34s %12.3f s\n", "a training step (for scale)", step_seconds);
  std::printf("(written to %s, %s; pages dropped from the cache before loading)\n", base.c_str(),
              FileSystemName(base).c_str());

  const std::string json = absl::StrCat(
      "{\n  \"benchmark\": \"checkpoint\",\n  \"quick\": ", quick ? "true" : "false",
      ",\n  \"device\": \"sim\",\n  \"host_cpus\": ", HostCpuCount(), ",\n  \"model\": {\"layers\": ", model.layers,
      ", \"hidden\": ", model.hidden, ", \"heads\": ", model.heads, ", \"vocab_size\": ", model.vocab_size,
      ", \"seq_len\": ", model.seq_len, ", \"params\": ", model.ParameterCount(), "},\n  \"precision\": \"fp32\"",
      ",\n  \"filesystem\": ", JsonString(FileSystemName(base)),
      absl::StrFormat(",\n  \"bytes\": %d,\n  \"save_blocking_seconds\": %.6f,\n  \"save_total_seconds\": %.6f,\n"
                      "  \"load_seconds\": %.6f,\n  \"load_read_seconds\": %.6f,\n  \"load_restore_seconds\": %.6f,\n"
                      "  \"step_seconds\": %.6f\n}\n",
                      bytes, saved.blocked_seconds, saved.total_seconds, load_seconds, read_seconds,
                      restore_seconds, step_seconds));
  return WriteBenchResult("checkpoint", absl::GetFlag(FLAGS_out), json);
}
