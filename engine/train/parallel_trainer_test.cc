// Tensor- and data-parallel training against one rank, with ranks as
// threads of the test (Gloo over an in-process store) sharing one simulated
// device with room for all of them.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "engine/checkpoint/test_files.h"
#include "engine/data/synthetic_source.h"
#include "engine/memory/simulated_device.h"
#include "engine/parallel/communicator.h"
#include "engine/train/trainer.h"

namespace ferry {
namespace {

class LossRecorder : public TrainingObserver {
 public:
  void OnStep(const StepReport& r) override {
    losses.push_back(r.loss);
    norms.push_back(r.grad_norm);
    skipped.push_back(r.skipped);
    memory = r.memory_stats;
  }
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<bool> skipped;
  // The last step's.
  StepMemoryStats memory;
  // What the rank's data group sent over the run, by collective.
  std::map<Collective, uint64_t> wire_bytes;
};

ModelConfig Model() {
  ModelConfig c;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.vocab_size = 64;
  c.seq_len = 32;
  c.dropout = 0.1;
  return c;
}

TrainOptions Options() {
  TrainOptions o;
  o.steps = 20;
  o.batch_size = 8;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.warmup_steps = 5;
  o.threads = 1;
  return o;
}

std::unique_ptr<TokenSource> Data() { return std::make_unique<SyntheticSource>(64, 2, 1, 5); }

// Rank 0's recorder for a world of tensor x data ranks.
LossRecorder TrainParallel(SimulatedDevice* device, int tensor, int data, MemoryOptions memory = {},
                           TrainOptions train = Options(), ModelConfig model = Model()) {
  c10::intrusive_ptr<c10d::Store> store = MakeInProcessStore();
  const int world = tensor * data;
  std::vector<LossRecorder> recorders(static_cast<size_t>(world));
  std::vector<absl::Status> results(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions options;
      options.timeout = std::chrono::seconds(60);
      absl::StatusOr<ParallelGroups> groups = JoinParallelGroups(store, r, tensor, data, options);
      if (!groups.ok()) {
        results[static_cast<size_t>(r)] = groups.status();
        return;
      }
      EngineOptions engine;
      engine.device = device;
      engine.memory = memory;
      engine.tensor = groups->tensor.get();
      CountingCommunicator counted(groups->data.get());
      engine.data = &counted;
      LossRecorder& recorder = recorders[static_cast<size_t>(r)];
      results[static_cast<size_t>(r)] = Trainer(model, train, engine, Data(), &recorder).Run();
      for (const CountingCommunicator::Call& call : counted.calls()) recorder.wire_bytes[call.collective] += call.wire_bytes;
      if (results[static_cast<size_t>(r)].ok()) results[static_cast<size_t>(r)] = FinishParallelGroups(*groups);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(results[static_cast<size_t>(r)].ok()) << "rank " << r << ": " << results[static_cast<size_t>(r)];
  // Every rank reports the same training.
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(recorders[static_cast<size_t>(r)].losses.size(), recorders[0].losses.size());
    for (size_t s = 0; s < recorders[0].losses.size(); ++s) {
      EXPECT_NEAR(recorders[static_cast<size_t>(r)].losses[s], recorders[0].losses[s], 1e-6) << "rank " << r;
    }
  }
  return recorders[0];
}

// `got` trained as `want` did: the same steps skipped (fp16 overflow), and
// the same losses and gradient norms (relative for norms above 1), step by
// step, within `tolerance`.
void ExpectSameTraining(const LossRecorder& got, const LossRecorder& want, double tolerance) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  EXPECT_EQ(got.skipped, want.skipped);
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], tolerance) << "step " << s + 1;
    if (want.skipped[s]) continue;  // (the norm is infinite)
    EXPECT_NEAR(got.norms[s], want.norms[s], tolerance * std::max(1.0, want.norms[s])) << "step " << s + 1;
  }
}

// T=2, D=2 and T=2 x D=2 follow one rank's loss curve over 20 steps (fp32,
// dropout on, the same global batch), within 1e-5.
TEST(ParallelTrainerTest, ParallelRunsReproduceOneRank) {
  SimulatedDevice device(uint64_t{8} << 30);
  LossRecorder one;
  EngineOptions engine;
  engine.device = &device;
  ASSERT_TRUE(Trainer(Model(), Options(), engine, Data(), &one).Run().ok());
  ASSERT_EQ(one.losses.size(), 20u);
  EXPECT_LT(one.losses.back(), one.losses.front() - 1.0) << "it learns";
  for (auto [tensor, data] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    SCOPED_TRACE(::testing::Message() << "tensor " << tensor << " data " << data);
    const LossRecorder parallel = TrainParallel(&device, tensor, data);
    ExpectSameTraining(parallel, one, 1e-5);
  }
}

// parallel.shard: optimizer and full at D = 2 and 4 (ranks as threads,
// fp32 and bf16, dropout on): the unsharded training's losses and norms
// within 1e-5 over 20 steps. With optimizer each rank holds 1/D of the
// optimizer states and the weights whole, and the reduce-scatter and
// all-gather send what one all-reduce of the gradients does; with full it
// holds 1/D of the weights and gradients too, and gathers the weights for
// every run of periods that computes with them (a forward and a backward at
// least) instead of once after the update.
TEST(ParallelTrainerTest, ShardedTrainingReproducesUnshardedTraining) {
  SimulatedDevice device(uint64_t{8} << 30);
  constexpr int kOpt = static_cast<int>(PayloadKind::kOptimizer), kParam = static_cast<int>(PayloadKind::kParam),
                kGrad = static_cast<int>(PayloadKind::kGrad);
  for (auto precision : {TrainOptions::Precision::kFp32, TrainOptions::Precision::kBf16}) {
    TrainOptions train = Options();
    train.precision = precision;
    for (int data : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << "data " << data << (precision == TrainOptions::Precision::kBf16 ? " bf16" : " fp32"));
      const LossRecorder whole = TrainParallel(&device, 1, data, {}, train);
      MemoryOptions shard;
      shard.shard = MemoryOptions::Shard::kOptimizer;
      const LossRecorder sharded = TrainParallel(&device, 1, data, shard, train);
      ExpectSameTraining(sharded, whole, 1e-5);
      auto bytes = [](const LossRecorder& r, int kind) { return r.memory.device_bytes[kind] + r.memory.host_bytes[kind]; };
      ASSERT_GT(bytes(whole, kOpt), 0u);
      // 1/D of the padded chunks (to whole shards, and those large enough
      // to shards on disk blocks: ShardChunks); the weights whole, padded.
      const double padded = double(bytes(sharded, kParam)) / double(bytes(whole, kParam));
      EXPECT_GE(padded, 1.0);
      EXPECT_LE(padded, 1.1);
      EXPECT_NEAR(double(bytes(sharded, kOpt)) * data / double(bytes(whole, kOpt)), padded, 1e-9);
      // Per step: an all-reduce of the gradients, against a reduce-scatter
      // of them and an all-gather of the weights (equal halves), beside the
      // norm's 8 bytes.
      const uint64_t reduced = whole.wire_bytes.at(Collective::kAllReduce);
      const uint64_t scattered = sharded.wire_bytes.at(Collective::kReduceScatter);
      const uint64_t gathered = sharded.wire_bytes.at(Collective::kAllGather);
      EXPECT_EQ(whole.wire_bytes.count(Collective::kReduceScatter), 0u);
      EXPECT_EQ(scattered, gathered) << "the weights are gathered in the gradients' type";
      EXPECT_NEAR(double(scattered + gathered) / double(reduced), padded, 0.02);

      MemoryOptions full_shard;
      full_shard.shard = MemoryOptions::Shard::kFull;
      const LossRecorder full = TrainParallel(&device, 1, data, full_shard, train);
      SCOPED_TRACE("full");
      ExpectSameTraining(full, whole, 1e-5);
      // The weights' and optimizer states' 1/D (of the padded chunks), on
      // the host: no chunk stays on the device after the step.
      EXPECT_EQ(full.memory.device_bytes[kParam] + full.memory.device_bytes[kOpt], 0u);
      EXPECT_NEAR(double(bytes(full, kParam)) * data / double(bytes(whole, kParam)), padded, 1e-9);
      EXPECT_NEAR(double(bytes(full, kOpt)) * data / double(bytes(whole, kOpt)), padded, 1e-9);
      // Gradients (of the weights' type) at most a shard of each chunk.
      EXPECT_GT(bytes(full, kGrad), 0u);
      EXPECT_LE(bytes(full, kGrad) * data, bytes(sharded, kParam));
      // The same reduce-scatter; the weights gathered per use, at least
      // twice a step.
      EXPECT_EQ(full.wire_bytes.at(Collective::kReduceScatter), scattered);
      EXPECT_GE(full.wire_bytes.at(Collective::kAllGather), 2 * gathered);
      // The auto policy prefetches a chunk's shard a period ahead, as each
      // rank's own plan says; the gather stays where every rank runs it.
      EXPECT_GT(full.memory.prefetch_hits, 0);
      // Where every rank did, the next period's gathers started beside
      // this one's compute.
      EXPECT_GT(full.memory.gathers_ahead, 0);
    }
  }
}

// fp16 with a loss scale that overflows at first, and clipping that bites:
// each rank sees only its shard of the gradients, yet every shard level
// skips the same steps (the data group sums the shards' squared norms, so an
// overflow anywhere is an overflow everywhere) and clips by the same global
// norm, as the unsharded ranks do.
TEST(ParallelTrainerTest, Fp16OverflowAndClippingAreTheSameAtEveryShardLevel) {
  SimulatedDevice device(uint64_t{8} << 30);
  TrainOptions train = Options();
  train.steps = 12;
  train.precision = TrainOptions::Precision::kFp16;
  train.loss_scale = 1048576.0;  // 2^20: the first gradients overflow fp16
  train.grad_clip = 0.05;
  const LossRecorder whole = TrainParallel(&device, 1, 2, {}, train);
  ASSERT_EQ(whole.skipped.size(), 12u);
  ASSERT_TRUE(whole.skipped[0]);
  int updated = 0, clipped = 0;
  for (size_t s = 0; s < whole.skipped.size(); ++s) {
    if (whole.skipped[s]) continue;
    ++updated;
    if (whole.norms[s] > train.grad_clip) ++clipped;
  }
  ASSERT_GT(updated, 2) << "the scale comes down until the gradients fit";
  ASSERT_GT(clipped, 0) << "clipping is active";
  for (auto level : {MemoryOptions::Shard::kOptimizer, MemoryOptions::Shard::kFull}) {
    SCOPED_TRACE(level == MemoryOptions::Shard::kFull ? "full" : "optimizer");
    MemoryOptions memory;
    memory.shard = level;
    ExpectSameTraining(TrainParallel(&device, 1, 2, memory, train), whole, 1e-5);
  }
}

// The same with each rank's chunks updated on the host (the static policy
// keeping every chunk there, the update overlapped where unsharded) and
// with the optimizer states on the disk tier: the shards are updated where
// their states live.
TEST(ParallelTrainerTest, ShardedOptimizerStatesOnTheHostAndOnDisk) {
  SimulatedDevice device(uint64_t{8} << 30);
  MemoryOptions host;
  host.policy = MemoryOptions::Policy::kStatic;
  host.static_param_host_fraction = 1.0;
  host.static_optimizer_host_fraction = 1.0;
  MemoryOptions disk = host;
  // Larger chunks than the search picks for so small a model (a shard on
  // disk starts on a disk block of 8192 bf16 elements, ShardChunks), and
  // more of them than the disk tier's staging: the states must go to disk.
  disk.host_budget_bytes = 5 << 19;
  disk.chunk_elements = 65536;
  ModelConfig deeper = Model();
  deeper.layers = 8;
  disk.disk_dir = testing::EmptyTestPath("sharded-disk-tier");
  disk.disk_budget_bytes = 1ull << 30;
  for (const auto& [name, memory] : {std::pair{"host", host}, std::pair{"disk", disk}}) {
    TrainOptions train = Options();
    train.steps = 8;
    train.precision = TrainOptions::Precision::kBf16;
    train.overlap_optimizer = true;
    train.grad_clip = 0.5;  // clipping active: the norm is every shard's
    SCOPED_TRACE(name);
    const ModelConfig model = std::string(name) == "disk" ? deeper : Model();
    const LossRecorder whole = TrainParallel(&device, 1, 2, memory, train, model);
    MemoryOptions full = memory;
    full.shard = MemoryOptions::Shard::kFull;
    ExpectSameTraining(TrainParallel(&device, 1, 2, full, train, model), whole, 1e-5);
    MemoryOptions shard = memory;
    shard.shard = MemoryOptions::Shard::kOptimizer;
    const LossRecorder sharded = TrainParallel(&device, 1, 2, shard, train, model);
    ExpectSameTraining(sharded, whole, 1e-5);
    const int opt = static_cast<int>(PayloadKind::kOptimizer);
    auto held = [&](const LossRecorder& r) {
      return r.memory.device_bytes[opt] + r.memory.host_bytes[opt] + r.memory.disk_bytes[opt];
    };
    if (std::string(name) == "disk") {
      EXPECT_GT(sharded.memory.disk_bytes[opt], 0u) << "the shards' states are on disk";
    } else {
      // Half of the padded chunks' (ShardChunks).
      const int param = static_cast<int>(PayloadKind::kParam);
      EXPECT_EQ(2 * held(sharded) * whole.memory.host_bytes[param], held(whole) * sharded.memory.host_bytes[param]);
      EXPECT_GT(whole.memory.overlapped_updates, 0) << "unsharded, the host updates overlap";
    }
  }
}

// A data group of two that is never used: the refusal comes first.
class IdleGroup : public Communicator {
 public:
  const std::string& name() const override { return name_; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void AllReduce(at::Tensor&, ReduceOp) override { ADD_FAILURE() << "a collective ran"; }
  std::unique_ptr<PendingCollective> StartReduceScatter(at::Tensor, at::Tensor) override {
    ADD_FAILURE() << "a collective ran";
    return nullptr;
  }
  void AllGatherInto(const at::Tensor&, const at::Tensor&) override { ADD_FAILURE() << "a collective ran"; }
  at::Tensor AllGather(const at::Tensor& t, int64_t) override { return t; }
  void Broadcast(at::Tensor&, int) override {}
  void Barrier() override {}

 private:
  std::string name_ = "data";
};

// Recomputing every block replays each rank's dropout on its shard of heads
// and rows: still the one-rank training.
TEST(ParallelTrainerTest, RecomputeOnEveryRankIsTheSameTraining) {
  SimulatedDevice device(uint64_t{8} << 30);
  LossRecorder one;
  EngineOptions engine;
  engine.device = &device;
  ASSERT_TRUE(Trainer(Model(), Options(), engine, Data(), &one).Run().ok());
  MemoryOptions all;
  all.recompute = MemoryOptions::Recompute::kAll;
  const LossRecorder parallel = TrainParallel(&device, 2, 2, all);
  ASSERT_EQ(parallel.losses.size(), one.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s) EXPECT_NEAR(parallel.losses[s], one.losses[s], 1e-5) << s + 1;
  // Fully sharded within each data group of tensor-parallel shards.
  all.shard = MemoryOptions::Shard::kFull;
  ExpectSameTraining(TrainParallel(&device, 2, 2, all), parallel, 1e-5);
}

TEST(ParallelTrainerTest, ABatchThatDoesNotSplitIsRefused) {
  SimulatedDevice device(uint64_t{1} << 30);
  IdleGroup data;
  EngineOptions engine;
  engine.device = &device;
  engine.data = &data;
  TrainOptions o = Options();
  o.batch_size = 7;
  LossRecorder recorder;
  const absl::Status s = Trainer(Model(), o, engine, Data(), &recorder).Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("train.batch_size: 7 does not split across 2 data-parallel ranks"), std::string::npos)
      << s;
}

// Gradient accumulation on each rank: T=2 and D=2 (each data rank's 4 rows
// as 2 micro-batches, one all-reduce per update) train as their runs
// without accumulation, dropout on, to fp32 rounding.
TEST(ParallelTrainerTest, AccumulationOnEveryRankIsTheSameTraining) {
  SimulatedDevice device(uint64_t{8} << 30);
  TrainOptions o = Options();
  o.steps = 6;
  for (auto [tensor, data] : {std::pair{2, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE(::testing::Message() << "tensor " << tensor << " data " << data);
    const LossRecorder whole = TrainParallel(&device, tensor, data, {}, o);
    TrainOptions accumulating = o;
    accumulating.grad_accum_steps = 2;
    const LossRecorder accumulated = TrainParallel(&device, tensor, data, {}, accumulating);
    ExpectSameTraining(accumulated, whole, 1e-6);
    if (data == 1) continue;
    // Fully sharded: the gradients not yet reduced go whole to the host
    // between micro-batches; reduced, this rank's shard of them.
    MemoryOptions full;
    full.shard = MemoryOptions::Shard::kFull;
    ExpectSameTraining(TrainParallel(&device, tensor, data, full, accumulating), whole, 1e-5);
  }
}

TEST(ParallelTrainerTest, AccumulationThatDoesNotSplitARanksShareIsRefused) {
  SimulatedDevice device(uint64_t{1} << 30);
  IdleGroup data;
  EngineOptions engine;
  engine.device = &device;
  engine.data = &data;
  TrainOptions o = Options();
  o.batch_size = 6;
  o.grad_accum_steps = 2;
  LossRecorder recorder;
  const absl::Status s = Trainer(Model(), o, engine, Data(), &recorder).Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("train.grad_accum_steps: 2 micro-batches on each of 2 data-parallel ranks"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("a multiple of 4"), std::string::npos) << s;
}

}  // namespace
}  // namespace ferry
