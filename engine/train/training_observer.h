#pragma once

// How the trainer reports to whoever runs it (the worker process, a test, a
// benchmark). Engine-side types only: no protobuf.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/memory/placement_report.h"

namespace ferry {

// Bytes of one kind of data in one memory tier.
struct MemoryUsage {
  // "device" or "host".
  std::string tier;
  // "param", "grad", "optimizer", "activation" (all memory that is not model
  // data: activations, workspace); empty for capacity.
  std::string kind;
  uint64_t bytes = 0;
};

struct TrainingStarted {
  // e.g. "cpu", "cuda:0".
  std::string device;
  int64_t parameters = 0;
  int64_t total_steps = 0;
};

struct StepReport {
  // 1-based.
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  // Before clipping.
  double grad_norm = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  // Since the start of training.
  int64_t tokens = 0;
  double elapsed_seconds = 0;
  uint64_t device_memory_bytes = 0;
  uint64_t host_memory_bytes = 0;
  std::vector<MemoryUsage> memory;
  std::vector<MemoryUsage> capacity;
  // What the memory manager did in the step (zero for the plain loop).
  StepMemoryStats memory_stats;
  // fp16: the loss scale the step used; whether its gradients overflowed so
  // that it updated nothing; steps skipped so far. 1, false, 0 otherwise.
  double loss_scale = 1.0;
  bool skipped = false;
  int64_t skipped_steps = 0;
  // After the steps that evaluate (TrainOptions::eval_every_steps, and the
  // last): the mean loss per token over the eval batches, the tokens they
  // hold, and the time evaluation took (not part of step_seconds).
  struct Eval {
    // Steps done when measured: 0 before the first update.
    int64_t step = 0;
    double loss = 0;
    int64_t tokens = 0;
    double seconds = 0;
  };
  std::optional<Eval> eval;
  // On the first step of a run that did not resume: the evaluation before
  // any update.
  std::optional<Eval> initial_eval;
  // Transformer blocks that recomputed their activations in this step.
  std::vector<int> recomputed_blocks;
  // Where the step's time went: sampling and moving the batch, the forward
  // (with the loss), the backward (with gradient reduction), the update.
  // `transfers` is the part of the last three spent copying chunks between
  // host and device.
  struct Times {
    double data = 0, forward = 0, backward = 0, optimizer = 0, transfers = 0;
    // Waiting for the disk tier (reads and writes not hidden behind other
    // work), part of the optimizer's time.
    double disk = 0;
  } times;
};

enum class LogLevel { kInfo, kWarning, kError };

class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  virtual void OnStarted(const TrainingStarted& started) { (void)started; }
  // After every optimizer step, on the training thread: keep it cheap.
  virtual void OnStep(const StepReport& report) = 0;
  virtual void OnLog(LogLevel level, const std::string& message) {
    (void)level;
    (void)message;
  }
  // After every step of a chunked run: where model data lives.
  virtual void OnPlacement(const PlacementReport& placement) { (void)placement; }
  // Polled between steps; true makes the trainer stop with CANCELLED.
  virtual bool StopRequested() { return false; }
};

}  // namespace ferry
