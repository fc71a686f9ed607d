#include "engine/memory/chunk_manager.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/common/torch_status.h"
#include "engine/memory/simulated_device.h"

namespace ferry {
namespace {

// Four stages of a small MLP (more with `extra` layers after l3); the last
// also uses the first layer's weight (a tied weight, as a GPT's embedding).
struct ToyModel {
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, l4{nullptr};
  std::vector<torch::nn::Linear> extras;
  explicit ToyModel(int64_t width = 32, int extra = 0) {
    torch::manual_seed(7);
    HostAllocationScope host;
    l1 = torch::nn::Linear(16, width);
    l2 = torch::nn::Linear(width, width);
    l3 = torch::nn::Linear(width, width);
    for (int i = 0; i < extra; ++i) extras.push_back(torch::nn::Linear(width, width));
    l4 = torch::nn::Linear(width, 1);
  }
  std::vector<ManagedParam> Params() {
    std::vector<ManagedParam> p = {{"l1.weight", l1->weight, true}, {"l1.bias", l1->bias, false},
                                   {"l2.weight", l2->weight, true}, {"l2.bias", l2->bias, false},
                                   {"l3.weight", l3->weight, true}, {"l3.bias", l3->bias, false}};
    for (size_t i = 0; i < extras.size(); ++i) {
      p.push_back({absl::StrCat("x", i, ".weight"), extras[i]->weight, true});
      p.push_back({absl::StrCat("x", i, ".bias"), extras[i]->bias, false});
    }
    p.push_back({"l4.weight", l4->weight, true});
    p.push_back({"l4.bias", l4->bias, false});
    return p;
  }
  static std::vector<StageParams> Stages() {
    return {{"s0", {0, 1}}, {"s1", {2, 3}}, {"s2", {4, 5}}, {"s3", {6, 7, 0}}};
  }
  std::vector<StageParams> AllStages() const {
    std::vector<StageParams> stages = {{"s0", {0, 1}}, {"s1", {2, 3}}, {"s2", {4, 5}}};
    int next = 6;
    for (size_t i = 0; i < extras.size(); ++i, next += 2) {
      stages.push_back({absl::StrCat("s", 3 + i), {next, next + 1}});
    }
    stages.push_back({absl::StrCat("s", stages.size()), {next, next + 1, 0}});
    return stages;
  }
  int stage_count() const { return 4 + static_cast<int>(extras.size()); }
  int last() const { return stage_count() - 1; }
  torch::Tensor Stage(int s, const torch::Tensor& x) {
    if (s == 0) return torch::tanh(l1->forward(x));
    if (s == 1) return torch::tanh(l2->forward(x));
    if (s == 2) return torch::tanh(l3->forward(x));
    if (s < last()) return torch::tanh(extras[static_cast<size_t>(s - 3)]->forward(x));
    return l4->forward(x) + 0.1 * x.matmul(l1->weight).sum(-1, true);
  }
};

// One step's forward through the manager: every stage, the last with the
// loss against `target` (computed in fp32).
torch::Tensor ToyForward(ChunkManager& manager, ToyModel& model, torch::Tensor x, const torch::Tensor& target) {
  for (int s = 0; s < model.stage_count(); ++s) {
    x = manager.RunStage(s, x, [&, s](const torch::Tensor& in) {
      torch::Tensor y = model.Stage(s, in);
      return s == model.last() ? torch::mse_loss(y.to(at::kFloat), target) : y;
    });
  }
  return x;
}

// A manager of the toy model's four stages in chunks of 1100 elements (one
// a stage), with the default optimizer.
absl::StatusOr<std::unique_ptr<ChunkManager>> ToyManager(MemoryDevice* device, ToyModel& model,
                                                          MemoryOptions options = {}) {
  options.chunk_elements = 1100;
  return ChunkManager::Create(device, model.Params(), ToyModel::Stages(), options, {});
}

struct RunResult {
  std::vector<float> losses;
  std::vector<StepMemoryStats> stats;
  PlacementReport placement;
  std::vector<torch::Tensor> values;
  uint64_t peak_host_model_bytes = 0;
};

// How a run is shaped beyond its memory options.
struct RunShape {
  int64_t width = 32;
  int extra = 0;
  int64_t chunk_elements = 1100;
  c10::ScalarType dtype = at::kFloat;
  double clip = 0.0;
  // Host-side updates beside the next step (OptimizerOptions::overlap).
  bool overlap = false;
  // Gradient accumulation: each step's batch of 8 as this many micro-batches.
  int micro_batches = 1;
  // Called between steps (after EndStep of `step`).
  std::function<void(int step, const PlacementReport&)> between;
  // After the warm-up, this much of the device taken by no allocation and
  // never given back (SimulatedDevice::SetReservedSlack): fragments the
  // device reports (unusable_bytes).
  uint64_t fragments_after_warmup = 0;
  // After the warm-up, fragments it does not report, which refuse chunks
  // but not compute's small blocks (FragmentedDevice).
  uint64_t hidden_fragments_after_warmup = 0;
  // Device-homed chunks updated with the GPU's kernel (FlatAdamWStep).
  bool device_kernel = false;
};

// A device with fragments it does not report: chunk buffers (AllocateDevice)
// are refused unless they fit beside `hidden` more bytes, while compute's
// small blocks still fit, as they do in a GPU's fragments.
class FragmentedDevice : public SimulatedDevice {
 public:
  using SimulatedDevice::SimulatedDevice;
  c10::DataPtr AllocateDevice(size_t bytes) override {
    if (allocated_bytes() + bytes + hidden > capacity_bytes()) {
      C10_THROW_ERROR(OutOfMemoryError, "no contiguous block for a chunk");
    }
    return SimulatedDevice::AllocateDevice(bytes);
  }
  uint64_t hidden = 0;
};

torch::Tensor Batch(int step, torch::Tensor* target) {
  torch::manual_seed(1000 + step);
  HostAllocationScope host;
  torch::Tensor x = torch::randn({8, 16});
  *target = x.sum(-1, true).sin();
  return x;
}

RunResult Train(uint64_t capacity, MemoryOptions options, int steps, const RunShape& shape) {
  FragmentedDevice device(capacity);
  ToyModel model(shape.width, shape.extra);
  options.chunk_elements = shape.chunk_elements;
  OptimizerOptions optimizer;
  optimizer.param_dtype = shape.dtype;
  optimizer.overlap = shape.overlap;
  optimizer.device_kernel_on_simulated_device = shape.device_kernel;
  auto manager = ChunkManager::Create(&device, model.Params(), model.AllStages(), options, optimizer);
  EXPECT_TRUE(manager.ok()) << manager.status();
  RunResult result;
  if (!manager.ok()) return result;
  for (int step = 1; step <= steps; ++step) {
    torch::Tensor target;
    const torch::Tensor batch = Batch(step, &target).to(shape.dtype);
    const int k = shape.micro_batches;
    const int64_t rows = 8 / k;
    (*manager)->BeginStep({rows, 16}, k);
    float loss = 0;
    for (int m = 0; m < k; ++m) {
      torch::Tensor x = ToyForward(**manager, model, batch.narrow(0, m * rows, rows), target.narrow(0, m * rows, rows));
      loss += x.item<float>();
      // The mean over the micro-batches: each one's mean loss over k.
      (k == 1 ? x : x / k).backward();
      absl::Status finished = (*manager)->FinishBackward();
      EXPECT_TRUE(finished.ok()) << finished;
    }
    result.losses.push_back(loss / k);
    (*manager)->OptimizerStep(step, 0.01, shape.clip);
    result.stats.push_back((*manager)->EndStep());
    if (step == 1) {
      device.SetReservedSlack(shape.fragments_after_warmup, /*releasable=*/false);
      device.hidden = shape.hidden_fragments_after_warmup;
    }
    if (shape.between) shape.between(step, (*manager)->Placement());
  }
  result.placement = (*manager)->Placement();
  result.values = (*manager)->ParameterValues();
  result.peak_host_model_bytes = (*manager)->peak_host_model_bytes();
  return result;
}

RunResult Train(uint64_t capacity, MemoryOptions options, int steps, double clip = 0.0) {
  RunShape shape;
  shape.clip = clip;
  return Train(capacity, std::move(options), steps, shape);
}

// The same model and data with plain tensors and torch::optim::AdamW.
std::vector<float> TrainPlain(int steps) {
  ToyModel model;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto decayed = std::make_unique<torch::optim::AdamWOptions>(0.01);
  decayed->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  auto plain = std::make_unique<torch::optim::AdamWOptions>(0.01);
  plain->betas({0.9, 0.95}).eps(1e-8).weight_decay(0.0);
  groups.emplace_back(std::vector<torch::Tensor>{model.l1->weight, model.l2->weight, model.l3->weight,
                                                 model.l4->weight},
                      std::move(decayed));
  groups.emplace_back(std::vector<torch::Tensor>{model.l1->bias, model.l2->bias, model.l3->bias,
                                                 model.l4->bias},
                      std::move(plain));
  torch::optim::AdamW adamw(groups, torch::optim::AdamWOptions(0.01));
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    torch::Tensor target;
    torch::Tensor x = Batch(step, &target);
    for (int s = 0; s < 4; ++s) x = model.Stage(s, x);
    torch::Tensor loss = torch::mse_loss(x, target);
    losses.push_back(loss.item<float>());
    adamw.zero_grad();
    loss.backward();
    adamw.step();
  }
  return losses;
}

constexpr uint64_t kAmple = 64 << 20;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Width 256 with ten extra layers: 13 chunks, 0.66 M parameters, 10.6 MB
// of model data in fp32 and in bf16.
constexpr int64_t kWide = 256;
constexpr int kWideExtra = 10;
constexpr int64_t kWideChunk = kWide * kWide + kWide;

RunShape Wide(c10::ScalarType dtype) {
  RunShape shape;
  shape.width = kWide;
  shape.extra = kWideExtra;
  shape.chunk_elements = kWideChunk;
  shape.dtype = dtype;
  return shape;
}

// A host budget below the model's data: the optimizer states go to disk.
MemoryOptions OnDisk(const std::string& dir, MemoryOptions options = {}) {
  options.host_budget_bytes = 8 << 20;
  options.disk_dir = dir;
  options.disk_budget_bytes = 1ull << 30;
  return options;
}


// The fused CPU AdamW kernel agrees with torch::optim::AdamW to float
// rounding (it contracts into fused multiply-adds), so the losses agree
// closely, not bit for bit.
TEST(ChunkManagerTest, ChunkedTrainingIsPlainTraining) {
  RunResult chunked = Train(kAmple, {}, 12);
  std::vector<float> plain = TrainPlain(12);
  ASSERT_EQ(chunked.losses.size(), plain.size());
  EXPECT_EQ(chunked.losses[0], plain[0]) << "the same model before any update";
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(chunked.losses[i], plain[i], 1e-5 * std::abs(plain[i])) << "step " << i + 1;
  }
  EXPECT_LT(chunked.losses.back(), chunked.losses.front());
}

TEST(ChunkManagerTest, AnAmpleDeviceHomesEverythingAndMovesNothingOnceWarm) {
  RunResult r = Train(kAmple, {}, 4);
  EXPECT_TRUE(r.stats[0].warmup);
  EXPECT_GT(r.stats[0].host_to_device_bytes, 0u) << "warm-up streams chunks";
  for (size_t s = 2; s < r.stats.size(); ++s) {
    EXPECT_FALSE(r.stats[s].warmup);
    EXPECT_EQ(r.stats[s].host_to_device_bytes, 0u) << "step " << s + 1;
    EXPECT_EQ(r.stats[s].device_to_host_bytes, 0u) << "step " << s + 1;
    EXPECT_EQ(r.stats[s].evictions, 0);
  }
  EXPECT_FALSE(r.placement.warmup);
  for (const PayloadReport& p : r.placement.payloads) {
    EXPECT_EQ(p.chunk_class, ChunkClass::kDeviceHomed) << p.id;
  }
  EXPECT_EQ(r.placement.planned_traffic_bytes, 0u);
}

// Capacity that holds the activations and a few chunks but not the whole
// model's parameters, gradients and optimizer states.
uint64_t TightCapacity() {
  // Chunks of at most 1100 floats, one per stage: 10756 bytes of parameters.
  return 34000;
}

TEST(ChunkManagerTest, ATightBudgetMovesChunksAndKeepsTheLossesExact) {
  RunResult ample = Train(kAmple, {}, 10);
  RunResult tight = Train(TightCapacity(), {}, 10);
  for (size_t i = 0; i < ample.losses.size(); ++i) {
    EXPECT_EQ(tight.losses[i], ample.losses[i]) << "step " << i + 1;
  }
  uint64_t moved = 0;
  for (size_t s = 1; s < tight.stats.size(); ++s) {
    moved += tight.stats[s].host_to_device_bytes + tight.stats[s].device_to_host_bytes;
    EXPECT_LE(tight.stats[s].peak_device_bytes, TightCapacity());
  }
  EXPECT_GT(moved, 0u);
  bool some_on_host = false;
  for (const PayloadReport& p : tight.placement.payloads) some_on_host |= p.chunk_class != ChunkClass::kDeviceHomed;
  EXPECT_TRUE(some_on_host);
}

TEST(ChunkManagerTest, StaticKeepsZeroOffloadsSplit) {
  MemoryOptions options;
  options.policy = MemoryOptions::Policy::kStatic;
  RunResult r = Train(kAmple, options, 4);
  RunResult ample = Train(kAmple, {}, 4);
  for (size_t i = 0; i < r.losses.size(); ++i) EXPECT_EQ(r.losses[i], ample.losses[i]);
  // Every step once the parameters are pinned (the first steady step fetches
  // them): each gradient chunk out, each updated parameter chunk back in.
  // Chunks follow stages: 544, 1056, 1056 and 33 floats.
  const uint64_t param_bytes = (544 + 1056 + 1056 + 33) * 4;
  for (size_t s = 2; s < r.stats.size(); ++s) {
    EXPECT_EQ(r.stats[s].device_to_host_bytes, param_bytes) << "step " << s + 1;
    EXPECT_EQ(r.stats[s].host_to_device_bytes, param_bytes) << "step " << s + 1;
  }
  for (const PayloadReport& p : r.placement.payloads) {
    EXPECT_EQ(p.chunk_class, ChunkClass::kPinnedParams) << p.id;
  }
}

uint64_t Need(const Plan& plan) { return plan.binding_need(); }

TEST(ChunkManagerTest, StaticRunsOutOfMemoryWhereAutoFits) {
  RunResult ample = Train(kAmple, {}, 3);
  const PlanInput in = PlanInputFromReport(ample.placement, kAmple);
  const uint64_t zero_offload_need = Need(PlanStatic(in, 0.0, 1.0));
  const uint64_t streamed_need = Need(EvaluatePlan(in, std::vector<ChunkClass>(4, ChunkClass::kStreamed)));
  ASSERT_LT(streamed_need * 1.2, double(zero_offload_need)) << "the toy must leave a gap";
  const uint64_t capacity = (streamed_need * 11 / 10 + zero_offload_need) / 2;

  MemoryOptions static_options;
  static_options.policy = MemoryOptions::Policy::kStatic;
  EXPECT_THROW(Train(capacity, static_options, 3), c10::OutOfMemoryError);
  RunResult automatic = Train(capacity, {}, 3);
  for (size_t i = 0; i < ample.losses.size(); ++i) EXPECT_EQ(automatic.losses[i], ample.losses[i]);
}

TEST(ChunkManagerTest, PrefetchBringsStreamedChunksAheadOfTheirPeriods) {
  RunResult ample = Train(kAmple, {}, 8);
  const uint64_t streamed_need = Need(EvaluatePlan(PlanInputFromReport(ample.placement, kAmple),
                                                   std::vector<ChunkClass>(4, ChunkClass::kStreamed)));
  // The planner streams a chunk only when pinning it does not fit: the
  // largest plan with one streamed chunk sits just above the streamed need.
  const PlanInput in = PlanInputFromReport(ample.placement, kAmple);
  uint64_t capacity = 0;
  for (uint64_t c = streamed_need * 21 / 20; c < 4 * streamed_need && capacity == 0; c += streamed_need / 50) {
    PlanInput at = in;
    at.limit_bytes = static_cast<uint64_t>(double(c) * 0.95);
    Plan plan = PlanAuto(at);
    int streamed = 0;
    for (ChunkClass k : plan.classes) streamed += k == ChunkClass::kStreamed;
    if (plan.feasible && streamed > 0 && streamed < 4) capacity = c;
  }
  ASSERT_GT(capacity, 0u);
  RunResult ahead = Train(capacity, {}, 8);
  int hits = 0, misses_ahead = 0;
  for (size_t s = 2; s < ahead.stats.size(); ++s) {
    hits += ahead.stats[s].prefetch_hits;
    misses_ahead += ahead.stats[s].prefetch_misses;
  }
  EXPECT_GT(hits, 0);

  MemoryOptions no_prefetch;
  no_prefetch.prefetch = false;
  RunResult on_demand = Train(capacity, no_prefetch, 8);
  int misses = 0;
  for (size_t s = 2; s < on_demand.stats.size(); ++s) {
    EXPECT_EQ(on_demand.stats[s].prefetch_hits, 0);
    misses += on_demand.stats[s].prefetch_misses;
  }
  EXPECT_GT(misses, misses_ahead) << "without prefetch the same chunks come on demand";
  for (size_t i = 0; i < ample.losses.size(); ++i) {
    EXPECT_EQ(ahead.losses[i], ample.losses[i]);
    EXPECT_EQ(on_demand.losses[i], ample.losses[i]);
  }
}

TEST(ChunkManagerTest, ImpossibleBudgetFailsAfterWarmUpWithTheNumbers) {
  RunResult ample = Train(kAmple, {}, 1);
  const uint64_t streamed_need = Need(EvaluatePlan(PlanInputFromReport(ample.placement, kAmple),
                                                   std::vector<ChunkClass>(4, ChunkClass::kStreamed)));
  // The warm-up fits, but not with the margin the plan keeps.
  SimulatedDevice device(streamed_need * 11 / 10);
  ToyModel model;
  MemoryOptions options;
  options.margin = 0.3;
  auto manager = ToyManager(&device, model, options);
  ASSERT_TRUE(manager.ok());
  torch::Tensor target;
  torch::Tensor x = Batch(1, &target);
  (*manager)->BeginStep({8, 16});
  for (int s = 0; s < 4; ++s) {
    x = (*manager)->RunStage(s, x, [&](const torch::Tensor& in) {
      torch::Tensor y = model.Stage(s, in);
      return s == 3 ? torch::mse_loss(y, target) : y;
    });
  }
  x.backward();
  absl::Status s = (*manager)->FinishBackward();
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("even with every chunk streamed"), std::string::npos) << s;
  EXPECT_NE(s.message().find("needs"), std::string::npos) << s;
  EXPECT_NE(s.message().find("memory.device_budget"), std::string::npos) << s;
}

TEST(ChunkManagerTest, OutOfMemoryIsExplainedWithTheNumbers) {
  SimulatedDevice device(6000);
  ToyModel model;
  auto manager = ToyManager(&device, model);
  ASSERT_TRUE(manager.ok());
  torch::Tensor target;
  torch::Tensor x = Batch(1, &target);
  (*manager)->BeginStep({8, 16});
  try {
    for (int s = 0; s < 4; ++s) {
      x = (*manager)->RunStage(s, x, [&](const torch::Tensor& in) { return model.Stage(s, in); });
    }
    FAIL() << "6000 bytes cannot hold the step";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = (*manager)->ExplainOutOfMemory(e.what_without_backtrace());
    EXPECT_NE(message.find("out of device memory in period 'forward s"), std::string::npos) << message;
    EXPECT_NE(message.find("warm-up"), std::string::npos) << message;
    EXPECT_NE(message.find("train.batch_size"), std::string::npos) << message;
  }
}

// A GPU can refuse memory the plan made room for: its caching allocator's
// fragments, which the plan does not see, take part of the budget. The
// manager gives back the device's cached memory, then evicts more, and
// retries: the same training, with more chunks moved.
TEST(ChunkManagerTest, ARefusedAllocationIsRetriedAfterEvictingMore) {
  RunResult plain = Train(TightCapacity(), {}, 8);
  RunShape shape;
  shape.hidden_fragments_after_warmup = TightCapacity() / 4;
  RunResult fragmented = Train(TightCapacity(), {}, 8, shape);
  ASSERT_EQ(fragmented.losses.size(), plain.losses.size());
  EXPECT_EQ(fragmented.losses, plain.losses);
  int retries = 0, evictions = 0, plain_evictions = 0;
  for (size_t s = 1; s < plain.stats.size(); ++s) {
    retries += fragmented.stats[s].allocation_retries;
    evictions += fragmented.stats[s].evictions;
    plain_evictions += plain.stats[s].evictions;
    EXPECT_EQ(plain.stats[s].allocation_retries, 0) << "step " << s + 1;
  }
  EXPECT_GT(retries, 0);
  EXPECT_GT(evictions, plain_evictions);
}

// Fragments the device reports are kept room for before anything is
// allocated: no refusal, the same training, more chunks moved.
TEST(ChunkManagerTest, ReportedFragmentsAreKeptRoomFor) {
  RunResult plain = Train(TightCapacity(), {}, 8);
  RunShape shape;
  shape.fragments_after_warmup = TightCapacity() / 4;
  RunResult fragmented = Train(TightCapacity(), {}, 8, shape);
  ASSERT_EQ(fragmented.losses.size(), plain.losses.size());
  EXPECT_EQ(fragmented.losses, plain.losses);
  int evictions = 0, plain_evictions = 0;
  for (size_t s = 1; s < plain.stats.size(); ++s) {
    EXPECT_EQ(fragmented.stats[s].allocation_retries, 0) << "step " << s + 1;
    evictions += fragmented.stats[s].evictions;
    plain_evictions += plain.stats[s].evictions;
  }
  EXPECT_GT(evictions, plain_evictions);
}

// With nothing left to evict, the device's error stands, with its numbers.
TEST(ChunkManagerTest, ARefusalNoEvictionCuresIsTheDevicesOutOfMemoryError) {
  SimulatedDevice device(TightCapacity());
  ToyModel model;
  auto manager = ToyManager(&device, model);
  ASSERT_TRUE(manager.ok());
  device.SetReservedSlack(TightCapacity() - 2000, /*releasable=*/false);
  torch::Tensor target;
  torch::Tensor x = Batch(1, &target);
  (*manager)->BeginStep({8, 16});
  try {
    x = (*manager)->RunStage(0, x, [&](const torch::Tensor& in) { return model.Stage(0, in); });
    FAIL() << "2000 bytes hold no chunk";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("reserved unused"), std::string::npos) << message;
  }
}

// Memory the device holds unused but can give back (a caching allocator's
// cached segments) is given back at the first refusal: nothing is evicted
// for it.
TEST(ChunkManagerTest, CachedMemoryIsGivenBackBeforeAnythingIsEvicted) {
  SimulatedDevice device(TightCapacity());
  ToyModel model;
  auto manager = ToyManager(&device, model);
  ASSERT_TRUE(manager.ok());
  device.SetReservedSlack(TightCapacity() - 2000, /*releasable=*/true);
  torch::Tensor target;
  torch::Tensor x = Batch(1, &target);
  (*manager)->BeginStep({8, 16});
  x = ToyForward(**manager, model, x, target);
  x.backward();
  ASSERT_TRUE((*manager)->FinishBackward().ok());
  (*manager)->OptimizerStep(1, 0.01, 0.0);
  const StepMemoryStats stats = (*manager)->EndStep();
  EXPECT_EQ(device.reserved_slack_bytes(), 0u);
  EXPECT_EQ(stats.allocation_retries, 1);
}

// The GPU's update kernel (FlatAdamWStep, LibTorch ops), run on the
// simulated device for the chunks it homes, is the host kernel's update to
// rounding: fp32 and bf16, with clipping active.
TEST(ChunkManagerTest, TheGpusUpdateKernelMatchesTheHostKernel) {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    RunShape host;
    host.dtype = dtype;
    host.clip = 0.05;
    RunShape gpu = host;
    gpu.device_kernel = true;
    RunResult a = Train(kAmple, {}, 8, host);
    RunResult b = Train(kAmple, {}, 8, gpu);
    ASSERT_EQ(a.losses.size(), b.losses.size());
    const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(a.losses[i], b.losses[i], tolerance * std::abs(a.losses[i])) << "step " << i + 1 << " " << dtype;
    }
    ASSERT_EQ(a.values.size(), b.values.size());
    for (size_t i = 0; i < a.values.size(); ++i) {
      const double diff = (a.values[i].to(at::kFloat) - b.values[i].to(at::kFloat)).abs().max().item<double>();
      EXPECT_LT(diff, dtype == at::kFloat ? 1e-5 : 1e-2) << "tensor " << i << " " << dtype;
    }
  }
}

TEST(ChunkManagerTest, AnOverflowedGradientSkipsTheUpdateEverywhere) {
  // (The toy's layers have no fp16 kernels on the CPU; the GPT's upcast.)
  // On an ample device (auto homes every chunk: device-side updates) and
  // under static (every update on the host side, its states on disk).
  for (int where = 0; where < 2; ++where)
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(absl::StrCat(c10::toString(dtype), where == 0 ? " device-side" : " host-side from disk"));
    SimulatedDevice device(kAmple);
    ToyModel model(where == 0 ? 32 : kWide, where == 0 ? 0 : kWideExtra);
    MemoryOptions options;
    options.chunk_elements = 1100;
    if (where == 1) {
      options = OnDisk(TestDir("skipped"));
      options.policy = MemoryOptions::Policy::kStatic;
      options.chunk_elements = kWideChunk;
    }
    OptimizerOptions optimizer;
    optimizer.param_dtype = dtype;
    auto manager = ChunkManager::Create(&device, model.Params(), model.AllStages(), options, optimizer);
    ASSERT_TRUE(manager.ok()) << manager.status();
    auto step = [&](int n, bool poison) {
      torch::Tensor target;
      torch::Tensor x = Batch(n, &target).to(dtype);
      (*manager)->BeginStep({8, 16});
      for (int s = 0; s < model.stage_count(); ++s) {
        x = (*manager)->RunStage(s, x, [&](const torch::Tensor& in) {
          torch::Tensor y = model.Stage(s, in);
          return s == model.last() ? torch::mse_loss(y.to(at::kFloat), target) : y;
        });
      }
      unsigned hook = 0;
      if (poison) {
        // An overflow in one gradient of one chunk.
        hook = model.l2->weight.register_hook([](torch::Tensor g) {
          g = g.clone();
          g.view({-1})[3] = std::numeric_limits<float>::infinity();
          return g;
        });
      }
      x.backward();
      if (poison) model.l2->weight.remove_hook(hook);
      EXPECT_TRUE((*manager)->FinishBackward().ok());
      const OptimizerResult r = (*manager)->OptimizerStep(n, 0.01, 1.0);
      (*manager)->EndStep();
      return r;
    };
    EXPECT_FALSE(step(1, false).skipped);
    const std::vector<torch::Tensor> before = (*manager)->ParameterValues();
    const OptimizerResult poisoned = step(2, true);
    EXPECT_TRUE(poisoned.skipped);
    EXPECT_TRUE(std::isinf(poisoned.grad_norm));
    const std::vector<torch::Tensor> after = (*manager)->ParameterValues();
    for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
    // The next step updates again.
    EXPECT_FALSE(step(3, false).skipped);
    EXPECT_FALSE(torch::equal((*manager)->ParameterValues()[2], before[2]));
  }
}

// Overlapped, the host-side updates run on the worker while the next step's
// forward goes on: the same kernel on the same values, with the clipping
// coefficient fixed from the complete norm before the first of them starts.
// Under static every update is on the host; auto on a tight device mixes
// host- and device-side updates with prefetch; from disk the staged updates
// stay in the step. Reading the values after the last step waits for them.
TEST(ChunkManagerTest, OverlappedUpdatesAreTheSynchronousOnesBitForBit) {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16})
  for (int placement = 0; placement < 3; ++placement) {
    SCOPED_TRACE(absl::StrCat(c10::toString(dtype), " ", placement == 0 ? "static" : placement == 1 ? "auto, tight" : "static, from disk"));
    MemoryOptions options;
    uint64_t capacity = kAmple;
    if (placement == 0) options.policy = MemoryOptions::Policy::kStatic;
    if (placement == 1) capacity = TightCapacity() * (dtype == at::kFloat ? 1 : 2);
    if (placement == 2) {
      options = OnDisk(TestDir(absl::StrCat("overlap", c10::toString(dtype))));
      options.policy = MemoryOptions::Policy::kStatic;
    }
    RunShape shape = placement == 2 ? Wide(dtype) : RunShape();
    shape.dtype = dtype;
    shape.clip = 0.05;  // below the gradients' norm: every update clips
    RunResult runs[2];
    for (int overlap = 0; overlap < 2; ++overlap) {
      shape.overlap = overlap == 1;
      runs[overlap] = Train(capacity, options, 6, shape);
    }
    const RunResult& sync = runs[0];
    const RunResult& overlapped = runs[1];
    ASSERT_EQ(overlapped.losses.size(), sync.losses.size());
    for (size_t i = 0; i < sync.losses.size(); ++i) EXPECT_EQ(overlapped.losses[i], sync.losses[i]) << "step " << i + 1;
    ASSERT_EQ(overlapped.values.size(), sync.values.size());
    for (size_t i = 0; i < sync.values.size(); ++i) EXPECT_TRUE(torch::equal(overlapped.values[i], sync.values[i])) << i;
    int left_running = 0;
    for (size_t s = 0; s < sync.stats.size(); ++s) {
      EXPECT_EQ(sync.stats[s].overlapped_updates, 0) << "step " << s + 1;
      left_running += overlapped.stats[s].overlapped_updates;
    }
    if (placement < 2) {
      EXPECT_GT(left_running, 0);
    }
  }
}

// Recompute with dropout: the stages' masks must come out the same when a
// stage re-runs in the backward.
TEST(ChunkManagerTest, RecomputedStagesGiveTheSameGradientsBitForBit) {
  auto run = [](MemoryOptions::Recompute mode, std::vector<double>* norms) {
    SimulatedDevice device(kAmple);
    ToyModel model;
    MemoryOptions options;
    options.chunk_elements = 1100;
    options.recompute = mode;
    std::vector<StageParams> stages = ToyModel::Stages();
    for (int s = 1; s < 3; ++s) stages[static_cast<size_t>(s)].recomputable = true;
    auto manager = ChunkManager::Create(&device, model.Params(), stages, options, {});
    EXPECT_TRUE(manager.ok());
    torch::manual_seed(11);
    std::vector<int> recomputed;
    for (int step = 1; step <= 4; ++step) {
      torch::Tensor target;
      torch::Tensor x = Batch(step, &target);
      (*manager)->BeginStep({8, 16});
      for (int s = 0; s < model.stage_count(); ++s) {
        x = (*manager)->RunStage(s, x, [&model, s, target](const torch::Tensor& in) {
          torch::Tensor y = model.Stage(s, in);
          if (s == 1 || s == 2) y = torch::dropout(y, 0.3, /*train=*/true);
          return s == model.last() ? torch::mse_loss(y, target) : y;
        });
      }
      x.backward();
      EXPECT_TRUE((*manager)->FinishBackward().ok());
      norms->push_back((*manager)->OptimizerStep(step, 0.01, 0.0).grad_norm);
      recomputed = (*manager)->EndStep().recomputed_stages;
    }
    EXPECT_EQ(recomputed, mode == MemoryOptions::Recompute::kAll ? std::vector<int>({1, 2}) : std::vector<int>());
    return (*manager)->ParameterValues();
  };
  std::vector<double> kept_norms, recomputed_norms;
  std::vector<torch::Tensor> kept = run(MemoryOptions::Recompute::kNone, &kept_norms);
  std::vector<torch::Tensor> recomputed = run(MemoryOptions::Recompute::kAll, &recomputed_norms);
  EXPECT_EQ(recomputed_norms, kept_norms);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(torch::equal(recomputed[i], kept[i])) << i;
}

TEST(ChunkManagerTest, HostBudgetIsEnforced) {
  SimulatedDevice device(kAmple);
  ToyModel model;
  MemoryOptions options;
  options.host_budget_bytes = 10000;  // less than the four parameter chunks
  auto manager = ToyManager(&device, model, options);
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(manager.status().message().find("memory.host_budget"), std::string::npos);
}

TEST(ChunkManagerTest, ANewBatchShapeRedoesTheWarmUp) {
  SimulatedDevice device(kAmple);
  ToyModel model;
  auto manager = ToyManager(&device, model);
  ASSERT_TRUE(manager.ok());
  std::vector<bool> warmups;
  for (int step = 1; step <= 5; ++step) {
    const int64_t batch = step <= 3 ? 8 : 32;
    HostAllocationScope host_batch;
    torch::Tensor x = torch::randn({batch, 16}), target = torch::zeros({batch, 1});
    (*manager)->BeginStep({batch, 16});
    for (int s = 0; s < model.stage_count(); ++s) {
      x = (*manager)->RunStage(s, x, [&](const torch::Tensor& in) {
        torch::Tensor y = model.Stage(s, in);
        return s == model.last() ? torch::mse_loss(y, target) : y;
      });
    }
    x.backward();
    ASSERT_TRUE((*manager)->FinishBackward().ok());
    (*manager)->OptimizerStep(step, 0.01, 1.0);
    warmups.push_back((*manager)->EndStep().warmup);
  }
  EXPECT_EQ(warmups, (std::vector<bool>{true, false, false, true, false}));
}

// The simulated device, counting the copies it is asked to make: what the
// manager reports moving is checked against what the device saw.
class CountingDevice : public SimulatedDevice {
 public:
  using SimulatedDevice::SimulatedDevice;
  TransferEvent CopyToDevice(const at::Tensor& host, const at::Tensor& device,
                             const TransferEvent& after) override {
    ++copies_in;
    bytes_in += static_cast<uint64_t>(host.numel()) * host.element_size();
    return SimulatedDevice::CopyToDevice(host, device, after);
  }
  int copies_in = 0;
  uint64_t bytes_in = 0;
};

TEST(ChunkManagerTest, ReportedFetchesAreTheCopiesTheDeviceMade) {
  CountingDevice device(TightCapacity());
  ToyModel model;
  auto manager = ToyManager(&device, model);
  ASSERT_TRUE(manager.ok()) << manager.status();
  for (int step = 1; step <= 3; ++step) {
    torch::Tensor target;
    torch::Tensor x = Batch(step, &target);
    (*manager)->BeginStep({8, 16});
    const int copies_before = device.copies_in;
    const uint64_t bytes_before = device.bytes_in;
    x = ToyForward(**manager, model, x, target);
    x.backward();
    ASSERT_TRUE((*manager)->FinishBackward().ok());
    (*manager)->OptimizerStep(step, 0.01, 0.0);
    const StepMemoryStats stats = (*manager)->EndStep();
    const PlacementReport placement = (*manager)->Placement();
    int reported = 0;
    for (const PeriodReport& period : placement.trace) reported += period.fetches + period.prefetches;
    EXPECT_EQ(reported, device.copies_in - copies_before) << "step " << step;
    EXPECT_EQ(stats.host_to_device_bytes, device.bytes_in - bytes_before) << "step " << step;
    if (step > 1) {
      EXPECT_GT(device.copies_in - copies_before, 0) << "a tight budget moves chunks every step";
    }
  }
}

TEST(ChunkManagerTest, PlacementReportsEveryChunkAndTheTrace) {
  RunResult r = Train(TightCapacity(), {}, 3);
  EXPECT_EQ(r.placement.payloads.size(), 12u) << "three payloads for each of four chunks";
  EXPECT_EQ(r.placement.payloads[0].id, "p0");
  EXPECT_EQ(r.placement.payloads[2].id, "o0");
  EXPECT_EQ(r.placement.trace.size(), 9u);
  EXPECT_EQ(r.placement.trace[0].name, "forward s0");
  EXPECT_EQ(r.placement.trace[4].name, "backward s3");
  EXPECT_EQ(r.placement.trace[8].name, "optimizer");
  EXPECT_EQ(r.placement.trace[7].chunks, (std::vector<int>{0}));
  EXPECT_GT(r.placement.trace[3].non_model_bytes, 0u);
  EXPECT_EQ(r.placement.capacity_bytes, TightCapacity());
  // The last step, period by period: what it measured and moved adds up to
  // the step's own figures, and never exceeds the device.
  const StepMemoryStats& last = r.stats.back();
  int evictions = 0, copies = 0;
  uint64_t peak_non_model = 0;
  for (const PeriodReport& period : r.placement.trace) {
    evictions += period.evictions;
    copies += period.fetches + period.prefetches;
    peak_non_model = std::max(peak_non_model, period.step_non_model_bytes);
    EXPECT_LE(period.step_device_model_bytes + period.step_non_model_bytes, TightCapacity()) << period.name;
    EXPECT_GT(period.warmup_non_model_bytes + period.step_device_model_bytes, 0u) << period.name;
  }
  EXPECT_EQ(evictions, last.evictions);
  EXPECT_EQ(peak_non_model, last.peak_non_model_bytes);
  EXPECT_GT(copies, 0) << "a tight budget moves chunks every step";
}

// The released copy's memory is PROT_NONE: the access itself faults, and the
// process dies of SIGSEGV (under AddressSanitizer or ThreadSanitizer, which
// catch the signal, with their SEGV report).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FERRY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FERRY_SANITIZED 1
#endif
#endif
#ifdef FERRY_SANITIZED
#define EXPECT_SEGV(statement) EXPECT_DEATH(statement, "SEGV on unknown address")
#else
#define EXPECT_SEGV(statement) EXPECT_EXIT(statement, ::testing::KilledBySignal(SIGSEGV), "")
#endif

TEST(ChunkManagerTest, TouchingAChunkThePeriodDidNotDeclareFaults) {
  // The simulated device runs copy threads: re-execute, do not fork them.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_SEGV(
      {
        SimulatedDevice device(kAmple);
        ToyModel model;
        MemoryOptions options;
        options.chunk_elements = 1100;
        // Stage 1 does not declare l2's parameters, so they are not resident.
        auto manager = ChunkManager::Create(&device, model.Params(),
                                            {{"s0", {0, 1}}, {"s1", {}}, {"s2", {4, 5}}, {"s3", {6, 7, 0, 2, 3}}},
                                            options, {});
        torch::Tensor target;
        torch::Tensor x = Batch(1, &target);
        (*manager)->BeginStep({8, 16});
        for (int s = 0; s < 2; ++s) {
          x = (*manager)->RunStage(s, x, [&](const torch::Tensor& in) { return model.Stage(s, in); });
        }
        std::fprintf(stderr, "stage 1 ran without faulting\n");
        std::exit(0);
      });
}

// A stage whose chunks are not on the device (a scheduling bug) is caught on
// the host before compute touches them, naming the tensor: on a GPU the
// kernel's fault would come later and poison the context. (Every period
// runs the check once its chunks are in; here it is asked outside one.)
TEST(ChunkManagerTest, ComputingWithAReleasedChunkFailsNamingTheTensor) {
  SimulatedDevice device(kAmple);
  ToyModel model;
  auto manager = ToyManager(&device, model);
  ASSERT_TRUE(manager.ok()) << manager.status();
  torch::Tensor target;
  torch::Tensor x = Batch(1, &target);
  (*manager)->BeginStep({8, 16});
  // The warm-up gives stage 0's chunk back once the stage has run.
  x = (*manager)->RunStage(0, x, [&](const torch::Tensor& in) { return model.Stage(0, in); });
  try {
    (*manager)->CheckResident(0);
    FAIL() << "stage 0's chunk is still on the device";
  } catch (const std::logic_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tensor l1.weight is about to be computed with, but chunk 0's parameters are not on the "
                           "device (sim)"),
              std::string::npos)
        << message;
  }
}

// --- The disk tier. ---

TEST(ChunkManagerTest, DiskTierTrainingIsHostOnlyTrainingBitForBit) {
  MemoryOptions streaming;
  // ZeRO-Offload's split: the optimizer runs on the host side every step,
  // so every steady step reads and writes the states on disk.
  streaming.policy = MemoryOptions::Policy::kStatic;
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const RunResult host = Train(kAmple, streaming, 6, Wide(dtype));
    const RunResult disk = Train(kAmple, OnDisk(TestDir("bitwise"), streaming), 6, Wide(dtype));
    ASSERT_EQ(disk.losses.size(), host.losses.size());
    for (size_t i = 0; i < host.losses.size(); ++i) EXPECT_EQ(disk.losses[i], host.losses[i]) << "step " << i + 1;
    ASSERT_EQ(disk.values.size(), host.values.size());
    for (size_t i = 0; i < host.values.size(); ++i) EXPECT_TRUE(torch::equal(disk.values[i], host.values[i])) << i;
    // The states really were on disk: read and written every step (from the
    // first in mixed precision, whose masters start there; fp32's states
    // start at the first update).
    for (size_t s = 0; s < disk.stats.size(); ++s) {
      if (s > 0 || dtype != at::kFloat) {
        EXPECT_GT(disk.stats[s].disk_to_host_bytes, 0u) << "step " << s + 1;
      }
      EXPECT_GT(disk.stats[s].host_to_disk_bytes, 0u) << "step " << s + 1;
      EXPECT_GT(disk.stats[s].disk_chunks, 0) << "step " << s + 1;
      EXPECT_EQ(host.stats[s].disk_to_host_bytes + host.stats[s].host_to_disk_bytes, 0u);
    }
    EXPECT_EQ(disk.stats.back().disk_to_host_bytes, disk.placement.planned_disk_read_bytes);
    EXPECT_EQ(disk.stats.back().host_to_disk_bytes, disk.placement.planned_disk_write_bytes);
    // Within the host budget, by the manager's own accounting, where the
    // host-only run needs more than it.
    EXPECT_LE(disk.peak_host_model_bytes, OnDisk("").host_budget_bytes);
    EXPECT_GT(host.peak_host_model_bytes, OnDisk("").host_budget_bytes);
    // Gradients go first (their write hides behind the backward), then
    // optimizer states; the weights stay on the host.
    int grads_on_disk = 0, states_on_disk = 0;
    for (const PayloadReport& p : disk.placement.payloads) {
      if (p.home != "disk") continue;
      EXPECT_NE(p.kind, PayloadKind::kParam) << p.id;
      // Between steps the states are on disk; the gradients were used up.
      EXPECT_EQ(p.tier, p.kind == PayloadKind::kOptimizer ? "disk" : "none") << p.id;
      EXPECT_GE(p.disk_bytes, p.bytes) << p.id;
      EXPECT_EQ(p.host_bytes, 0u) << p.id;
      ++(p.kind == PayloadKind::kGrad ? grads_on_disk : states_on_disk);
    }
    EXPECT_GT(grads_on_disk, 0);
    EXPECT_GT(states_on_disk, 0);
  }
}

TEST(ChunkManagerTest, AutoOnATightDeviceTrainsFromDiskBitForBit) {
  const uint64_t capacity = 6 << 20;  // a third of the model's data
  const RunResult host = Train(capacity, {}, 5, Wide(at::kBFloat16));
  const RunResult disk = Train(capacity, OnDisk(TestDir("auto")), 5, Wide(at::kBFloat16));
  for (size_t i = 0; i < host.losses.size(); ++i) EXPECT_EQ(disk.losses[i], host.losses[i]) << "step " << i + 1;
  for (size_t i = 0; i < host.values.size(); ++i) EXPECT_TRUE(torch::equal(disk.values[i], host.values[i])) << i;
  EXPECT_GT(disk.stats.back().disk_to_host_bytes, 0u);
  EXPECT_LE(disk.peak_host_model_bytes, OnDisk("").host_budget_bytes);
}

TEST(ChunkManagerTest, ScratchFilesGoWithTheManager) {
  const std::string dir = TestDir("scratch");
  std::string scratch;
  RunShape shape = Wide(at::kBFloat16);
  shape.between = [&](int, const PlacementReport& placement) { scratch = placement.disk_dir; };
  MemoryOptions options = OnDisk(dir);
  options.policy = MemoryOptions::Policy::kStatic;
  Train(kAmple, options, 2, shape);
  ASSERT_FALSE(scratch.empty());
  EXPECT_EQ(scratch.rfind(dir, 0), 0u) << scratch << " is inside " << dir;
  struct stat st;
  EXPECT_NE(::stat(scratch.c_str(), &st), 0) << scratch << " is removed";
  EXPECT_TRUE(FilesIn(dir).empty());
}

// A manager made for a resume fills no chunk (nothing drawn, copied or
// written to the disk tier only to be replaced), and RestoreState gives it
// the saved values exactly.
TEST(ChunkManagerTest, AManagerMadeForARestoreHoldsNothingUntilItIsRestored) {
  SimulatedDevice device(kAmple);
  MemoryOptions options = OnDisk(TestDir("restore"));
  options.policy = MemoryOptions::Policy::kStatic;
  options.chunk_elements = kWideChunk;
  OptimizerOptions optimizer;
  optimizer.param_dtype = at::kBFloat16;
  ToyModel saved_model(kWide, kWideExtra);
  auto saved = ChunkManager::Create(&device, saved_model.Params(), saved_model.AllStages(), options, optimizer);
  ASSERT_TRUE(saved.ok()) << saved.status();
  std::string state;
  ASSERT_TRUE((*saved)->SaveState([&](const void* data, size_t size) {
    state.append(static_cast<const char*>(data), size);
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(state.size(), (*saved)->StateBytes());

  ToyModel restored_model(kWide, kWideExtra);
  options.values_from_checkpoint = true;
  auto restored =
      ChunkManager::Create(&device, restored_model.Params(), restored_model.AllStages(), options, optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_LT((*restored)->host_model_bytes(), (*saved)->host_model_bytes()) << "no chunk's host copy is made";
  size_t at = 0;
  ASSERT_TRUE((*restored)->RestoreState(state.size(), [&](void* data, size_t size) {
    std::memcpy(data, state.data() + at, size);
    at += size;
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(at, state.size());
  const std::vector<at::Tensor> expected = (*saved)->ParameterValues();
  const std::vector<at::Tensor> values = (*restored)->ParameterValues();
  ASSERT_EQ(values.size(), expected.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(torch::equal(values[i], expected[i])) << i;
}

TEST(ChunkManagerTest, ADamagedChunkFileFailsTheStepNamingIt) {
  const std::string dir = TestDir("damaged");
  SimulatedDevice device(kAmple);
  ToyModel model(kWide, kWideExtra);
  MemoryOptions options = OnDisk(dir);
  options.policy = MemoryOptions::Policy::kStatic;
  options.chunk_elements = kWideChunk;
  OptimizerOptions optimizer;
  optimizer.param_dtype = at::kBFloat16;
  auto manager = ChunkManager::Create(&device, model.Params(), model.AllStages(), options, optimizer);
  ASSERT_TRUE(manager.ok()) << manager.status();
  const std::string scratch = (*manager)->Placement().disk_dir;
  std::vector<std::string> files = FilesIn(scratch);
  // The optimizer states' files hold the masters from the start.
  files.erase(std::remove_if(files.begin(), files.end(), [](const std::string& f) { return f[0] != 'o'; }),
              files.end());
  ASSERT_FALSE(files.empty());
  // One flipped byte in the middle of a chunk file.
  const std::string victim = scratch + "/" + files.front();
  const int fd = ::open(victim.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, 4096), 1);
  byte = static_cast<char>(byte ^ 0x40);
  ASSERT_EQ(::pwrite(fd, &byte, 1, 4096), 1);
  ::close(fd);
  torch::Tensor target;
  torch::Tensor x = Batch(1, &target).to(at::kBFloat16);
  (*manager)->BeginStep({8, 16});
  x = ToyForward(**manager, model, x, target);
  x.backward();
  ASSERT_TRUE((*manager)->FinishBackward().ok());
  try {
    (*manager)->OptimizerStep(1, 0.01, 0.0);
    ADD_FAILURE() << "the step used a damaged chunk file";
  } catch (const StatusException& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDataLoss) << e.status();
    EXPECT_NE(std::string(e.status().message()).find(victim), std::string::npos) << e.status();
    EXPECT_NE(std::string(e.status().message()).find("checksum"), std::string::npos) << e.status();
  }
}

TEST(ChunkManagerTest, DeviceHomedChunksLeaveNoCopyOnTheHost) {
  // An ample device homes every chunk: once the first steady step has run,
  // the host holds nothing for them.
  RunResult r = Train(kAmple, {}, 4);
  for (size_t s = 2; s < r.stats.size(); ++s) {
    for (int k = 0; k < 3; ++k) EXPECT_EQ(r.stats[s].host_bytes[k], 0u) << "step " << s + 1 << " kind " << k;
    EXPECT_EQ(r.stats[s].host_model_bytes, 0u) << "step " << s + 1;
  }
  for (const PayloadReport& p : r.placement.payloads) EXPECT_EQ(p.host_bytes, 0u) << p.id;
}

TEST(ChunkManagerTest, ModelDataThatFitsNoTierIsRefusedWithTheNumbers) {
  SimulatedDevice device(kAmple);
  ToyModel model(kWide, kWideExtra);
  MemoryOptions options = OnDisk(TestDir("refused"));
  options.chunk_elements = kWideChunk;
  options.disk_budget_bytes = 1 << 20;  // far less than the states need
  OptimizerOptions optimizer;
  optimizer.param_dtype = at::kBFloat16;
  auto manager = ChunkManager::Create(&device, model.Params(), model.AllStages(), options, optimizer);
  ASSERT_EQ(manager.status().code(), absl::StatusCode::kResourceExhausted) << manager.status();
  EXPECT_NE(manager.status().message().find("memory.disk_budget"), std::string::npos) << manager.status();
}

// Gradient accumulation: the batch as 2 or 4 micro-batches, their gradients
// summed before one update, is the same training as the whole batch at
// once, to float rounding, wherever the chunks live: homed on an ample
// device, moved under auto on a tight one, streamed under static, and with
// the host-side updates overlapped.
TEST(ChunkManagerTest, AccumulatedMicroBatchesAreTheWholeBatchsTraining) {
  struct Case {
    const char* name;
    uint64_t capacity;
    MemoryOptions options;
    RunShape shape;
  };
  MemoryOptions static_split;
  static_split.policy = MemoryOptions::Policy::kStatic;
  RunShape overlapped;
  overlapped.overlap = true;
  const std::vector<Case> cases = {
      {"ample", kAmple, {}, {}},
      {"tight auto", TightCapacity(), {}, {}},
      {"static", kAmple, static_split, {}},
      {"static overlapped", kAmple, static_split, overlapped},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const RunResult whole = Train(c.capacity, c.options, 5, c.shape);
    for (int k : {2, 4}) {
      SCOPED_TRACE(absl::StrCat(k, " micro-batches"));
      RunShape shape = c.shape;
      shape.micro_batches = k;
      const RunResult accumulated = Train(c.capacity, c.options, 5, shape);
      ASSERT_EQ(accumulated.losses.size(), whole.losses.size());
      for (size_t i = 0; i < whole.losses.size(); ++i) {
        EXPECT_NEAR(accumulated.losses[i], whole.losses[i], 1e-6) << "step " << i + 1;
      }
      ASSERT_EQ(accumulated.values.size(), whole.values.size());
      for (size_t i = 0; i < whole.values.size(); ++i) {
        EXPECT_LE((accumulated.values[i] - whole.values[i]).abs().max().item<float>(), 1e-6) << i;
      }
      for (const StepMemoryStats& st : accumulated.stats) EXPECT_LE(st.peak_device_bytes, c.capacity);
    }
  }
}

// With the gradients on disk, each micro-batch's gradients are written
// there and read back to be added to: the same training bit for bit as
// accumulating through host memory. (The wide toy's deep tanh stack at this
// learning rate amplifies float rounding, so it is compared with itself.)
TEST(ChunkManagerTest, AccumulationThroughTheDiskTierIsAccumulationThroughTheHost) {
  MemoryOptions static_split;
  static_split.policy = MemoryOptions::Policy::kStatic;
  RunShape shape = Wide(at::kFloat);
  const RunResult whole = Train(kAmple, static_split, 1, shape);
  shape.micro_batches = 2;
  const RunResult host = Train(kAmple, static_split, 4, shape);
  const RunResult disk = Train(kAmple, OnDisk(TestDir("accumulate"), static_split), 4, shape);
  EXPECT_NEAR(host.losses[0], whole.losses[0], 1e-6 * std::abs(whole.losses[0]));
  ASSERT_EQ(disk.losses.size(), host.losses.size());
  for (size_t i = 0; i < host.losses.size(); ++i) EXPECT_EQ(disk.losses[i], host.losses[i]) << "step " << i + 1;
  for (size_t i = 0; i < host.values.size(); ++i) EXPECT_TRUE(torch::equal(disk.values[i], host.values[i])) << i;
  EXPECT_GT(disk.stats.back().disk_chunks, 0);
  EXPECT_GT(disk.stats.back().host_to_disk_bytes, 0u);
}

// fp16 and bf16 gradients accumulate in their own type: close to the whole
// batch's, not to float rounding.
TEST(ChunkManagerTest, AccumulatedReducedPrecisionGradientsTrackTheWholeBatch) {
  MemoryOptions static_split;
  static_split.policy = MemoryOptions::Policy::kStatic;
  RunShape shape;
  shape.dtype = at::kBFloat16;
  const RunResult whole = Train(kAmple, static_split, 5, shape);
  shape.micro_batches = 4;
  const RunResult accumulated = Train(kAmple, static_split, 5, shape);
  for (size_t i = 0; i < whole.losses.size(); ++i) {
    EXPECT_NEAR(accumulated.losses[i], whole.losses[i], 1e-2 * std::abs(whole.losses[i])) << "step " << i + 1;
  }
}

// An overflow in one micro-batch's gradients skips the whole update: no
// weight changes, on the device and on the host side.
TEST(ChunkManagerTest, AnOverflowInOneMicroBatchSkipsTheUpdate) {
  for (int where = 0; where < 2; ++where) {
    SCOPED_TRACE(where == 0 ? "device-side" : "host-side");
    SimulatedDevice device(kAmple);
    ToyModel model;
    MemoryOptions options;
    options.chunk_elements = 1100;
    if (where == 1) options.policy = MemoryOptions::Policy::kStatic;
    auto manager = ChunkManager::Create(&device, model.Params(), model.AllStages(), options, OptimizerOptions());
    ASSERT_TRUE(manager.ok()) << manager.status();
    // Two micro-batches of 4; `poisoned`: the second's gradients overflow.
    auto step = [&](int n, int poisoned) {
      torch::Tensor target;
      const torch::Tensor batch = Batch(n, &target);
      (*manager)->BeginStep({4, 16}, 2);
      for (int m = 0; m < 2; ++m) {
        torch::Tensor x = ToyForward(**manager, model, batch.narrow(0, 4 * m, 4), target.narrow(0, 4 * m, 4));
        unsigned hook = 0;
        if (m == poisoned) {
          hook = model.l2->weight.register_hook([](torch::Tensor g) {
            g = g.clone();
            g.view({-1})[3] = std::numeric_limits<float>::infinity();
            return g;
          });
        }
        (x / 2).backward();
        if (m == poisoned) model.l2->weight.remove_hook(hook);
        EXPECT_TRUE((*manager)->FinishBackward().ok());
      }
      const OptimizerResult r = (*manager)->OptimizerStep(n, 0.01, 1.0);
      (*manager)->EndStep();
      return r;
    };
    for (int n = 1; n <= 2; ++n) EXPECT_FALSE(step(n, -1).skipped);
    for (int poisoned : {0, 1}) {
      const std::vector<torch::Tensor> before = (*manager)->ParameterValues();
      const OptimizerResult r = step(3, poisoned);
      EXPECT_TRUE(r.skipped) << "micro-batch " << poisoned;
      const std::vector<torch::Tensor> after = (*manager)->ParameterValues();
      for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
    }
    EXPECT_FALSE(step(3, -1).skipped) << "the next update goes ahead";
  }
}

// A product that writes its weight's gradient where the weight keeps it, as
// the GPT's linear layers do: overwriting it where `claims` says it holds
// nothing yet, else adding to it. `write` false: it gives the weight no
// gradient at all (as a frozen layer's).
struct ClaimingProduct : public torch::autograd::Function<ClaimingProduct> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               int64_t claims, bool write) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["weight"] = w;
    ctx->saved_data["claims"] = claims;
    ctx->saved_data["write"] = write;
    return x.matmul(w.t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (ctx->saved_data["write"].toBool()) {
      const torch::Tensor param = ctx->saved_data["weight"].toTensor();
      const torch::Tensor product = grads[0].t().mm(saved[0]);
      auto* claims = reinterpret_cast<GradientClaims*>(ctx->saved_data["claims"].toInt());
      if (claims != nullptr && claims->Claim(param)) {
        param.grad().copy_(product);
      } else {
        param.grad().add_(product);
      }
    }
    return {grads[0].matmul(saved[1]), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Chunk buffers come back full of NaNs: whatever is read of them before it
// is written shows.
class PoisonedDevice : public SimulatedDevice {
 public:
  using SimulatedDevice::SimulatedDevice;
  c10::DataPtr AllocateDevice(size_t bytes) override {
    c10::DataPtr data = SimulatedDevice::AllocateDevice(bytes);
    if (data.get() != nullptr) std::memset(data.get(), 0xff, bytes);
    return data;
  }
};

// Counts the claims that found a gradient unwritten; passes them to
// `manager`, or with none never claims (every gradient zeroed first).
struct CountedClaims : public GradientClaims {
  bool Claim(const at::Tensor& param) override {
    const bool claimed = manager != nullptr && manager->Claim(param);
    claimed_this_step += claimed ? 1 : 0;
    return claimed;
  }
  ChunkManager* manager = nullptr;
  int claimed_this_step = 0;
};

// Gradients claimed in an earlier step start unwritten -- on a device whose
// fresh memory is NaN -- and are overwritten by their products; one no
// product writes is zero once its chunk's backward is complete. Training is
// bit for bit the training with every gradient zeroed and added to, with
// the chunks staying on the device and moving.
TEST(ChunkManagerTest, ClaimedGradientsAreWrittenNotZeroedAndTrainTheSame) {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16})
  for (uint64_t capacity : {kAmple, 2 * TightCapacity()}) {
    SCOPED_TRACE(absl::StrCat(c10::toString(dtype), capacity == kAmple ? " ample" : " tight"));
    std::vector<float> losses[2];
    std::vector<torch::Tensor> values[2];
    for (int claiming = 0; claiming < 2; ++claiming) {
      PoisonedDevice device(capacity);
      ToyModel model;
      OptimizerOptions optimizer;
      optimizer.param_dtype = dtype;
      MemoryOptions options;
      options.chunk_elements = 1100;
      auto manager = ChunkManager::Create(&device, model.Params(), ToyModel::Stages(), options, optimizer);
      ASSERT_TRUE(manager.ok()) << manager.status();
      CountedClaims claims;
      if (claiming == 1) claims.manager = manager->get();
      const int unwritten_step = 3;  // l3's product writes no gradient
      uint64_t moved = 0;
      for (int step = 1; step <= 5; ++step) {
        torch::Tensor target;
        torch::Tensor x = Batch(step, &target).to(dtype);
        (*manager)->BeginStep({8, 16});
        claims.claimed_this_step = 0;
        const int64_t handle = reinterpret_cast<int64_t>(&claims);
        for (int s = 0; s < 4; ++s) {
          x = (*manager)->RunStage(s, x, [&](const torch::Tensor& in) {
            if (s == 1) return torch::tanh(ClaimingProduct::apply(in, model.l2->weight, handle, true) + model.l2->bias);
            if (s == 2) {
              return torch::tanh(ClaimingProduct::apply(in, model.l3->weight, handle, step != unwritten_step) +
                                 model.l3->bias);
            }
            torch::Tensor y = model.Stage(s, in);
            return s == 3 ? torch::mse_loss(y.to(at::kFloat), target) : y;
          });
        }
        losses[claiming].push_back(x.item<float>());
        x.backward();
        ASSERT_TRUE((*manager)->FinishBackward().ok());
        if (step == unwritten_step) {
          EXPECT_TRUE(torch::equal(model.l3->weight.grad(), torch::zeros_like(model.l3->weight.grad())))
              << "a gradient no product wrote is zero";
        }
        (*manager)->OptimizerStep(step, 0.01, /*max_grad_norm=*/0.0);
        const StepMemoryStats stats = (*manager)->EndStep();
        if (step > 1) moved += stats.host_to_device_bytes + stats.device_to_host_bytes;
        // Claims are learned in the warm-up: from the next step on, each
        // product's claim finds its gradient unwritten.
        const int expected = claiming == 0 || step == 1 ? 0 : step == unwritten_step ? 1 : 2;
        EXPECT_EQ(claims.claimed_this_step, expected) << "step " << step;
      }
      values[claiming] = (*manager)->ParameterValues();
      if (capacity != kAmple) EXPECT_GT(moved, 0u) << "the tight device moves chunks";
    }
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_TRUE(std::isfinite(losses[1][i])) << "step " << i + 1;
      EXPECT_EQ(losses[1][i], losses[0][i]) << "step " << i + 1;
    }
    ASSERT_EQ(values[1].size(), values[0].size());
    for (size_t i = 0; i < values[0].size(); ++i) EXPECT_TRUE(torch::equal(values[1][i], values[0][i])) << i;
  }
}

}  // namespace
}  // namespace ferry
