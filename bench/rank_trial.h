#pragma once

// Training runs of tensor x data ranks as threads of this process, with Gloo
// over an in-process store and every collective counted: what the parallel
// benchmarks measure.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "bench/sim_trial.h"
#include "engine/parallel/communicator.h"

namespace ferry {

struct RankTrial {
  absl::Status status;
  Collector observer;
  // Each group's collectives, in the order this rank ran them.
  std::vector<CountingCommunicator::Call> tensor_calls, data_calls;

  // What this rank sent under the ring algorithm (CountingCommunicator),
  // all groups together, in the collectives the steps run (the set-up's
  // broadcasts left out).
  uint64_t StepWireBytes() const {
    uint64_t bytes = 0;
    for (const auto* calls : {&tensor_calls, &data_calls}) {
      for (const CountingCommunicator::Call& c : *calls) {
        if (c.collective != Collective::kBroadcast) bytes += c.wire_bytes;
      }
    }
    return bytes;
  }
};

// Trains `model` with `train` and `memory` as tensor x data ranks sharing
// `device` (world rank d * tensor + t); each rank's trial, by world rank.
inline std::vector<std::unique_ptr<RankTrial>> TrainRanks(MemoryDevice* device, const ModelConfig& model,
                                                          const TrainOptions& train,
                                                          const std::optional<MemoryOptions>& memory, int tensor,
                                                          int data) {
  const int world = tensor * data;
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  std::vector<std::unique_ptr<RankTrial>> trials;
  for (int r = 0; r < world; ++r) trials.push_back(std::make_unique<RankTrial>());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankTrial& trial = *trials[static_cast<size_t>(r)];
      CommunicatorOptions options;
      options.timeout = std::chrono::minutes(5);
      absl::StatusOr<ParallelGroups> groups = JoinParallelGroups(store, r, tensor, data, options);
      if (!groups.ok()) {
        trial.status = groups.status();
        return;
      }
      CountingCommunicator t(groups->tensor.get()), d(groups->data.get());
      EngineOptions engine;
      engine.device = device;
      engine.memory = memory;
      engine.tensor = &t;
      engine.data = &d;
      trial.status = Trainer(model, train, engine, std::make_unique<SyntheticSource>(model.vocab_size, 2, 1, 1),
                             &trial.observer)
                         .Run();
      // A rank that failed leaves the others to their collective timeout.
      if (trial.status.ok()) trial.status = FinishParallelGroups(*groups);
      trial.tensor_calls = t.calls();
      trial.data_calls = d.calls();
    });
  }
  for (std::thread& th : threads) th.join();
  return trials;
}

// The first rank's error, or OK.
inline absl::Status FirstFailure(const std::vector<std::unique_ptr<RankTrial>>& trials) {
  for (const auto& t : trials) {
    if (!t->status.ok()) return t->status;
  }
  return absl::OkStatus();
}

}  // namespace ferry
