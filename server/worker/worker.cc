#include "server/worker/worker.h"

#include <ATen/Parallel.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "engine/checkpoint/async_writer.h"
#include "engine/checkpoint/checkpoint_store.h"
#include "engine/common/safe_path.h"
#include "engine/common/status_macros.h"
#include "engine/data/synthetic_source.h"
#include "engine/data/token_file_source.h"
#include "engine/device/device.h"
#include "engine/memory/memory_device.h"
#include "engine/memory/tier_plan.h"
#include "engine/parallel/communicator.h"
#include "engine/train/trainer.h"
#include "ferry/internal/worker.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/spec/job_file.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/spec_validator.h"
#include "engine/common/host_info.h"
#include "server/common/proto_time.h"
#include "server/worker/disk_tier_dir.h"
#include "server/worker/frame.h"
#include "server/worker/job_setup.h"
#include "server/worker/training_fingerprint.h"

namespace ferry {
namespace {

using ferry::internal::Finished;
using ferry::internal::WorkerReport;

// Set from signal handlers (SIGTERM, SIGINT): the only state a handler may
// touch is a lock-free atomic with static storage.
std::atomic<bool> g_signal_stop{false};

void OnStopSignal(int) { g_signal_stop.store(true); }

// Reports to the daemon over frames, or to a person on stdout.
class Reporter : public TrainingObserver {
 public:
  // `quiet`: print no progress (a rank other than 0 under a launcher).
  Reporter(int report_fd, bool quiet, int rank, int world_size)
      : report_fd_(report_fd), quiet_(quiet), rank_(rank), world_size_(world_size) {}

  void Send(const WorkerReport& report) {
    if (report_fd_ < 0) return;
    absl::MutexLock lock(&mu_);
    (void)WriteFrame(report_fd_, report);  // a gone daemon shows up as a stop
  }

  // A checkpoint is complete: the daemon records it (Job.last_checkpoint).
  void OnCheckpoint(const CheckpointWriteResult& r, const std::string& root) {
    WorkerReport report;
    ferry::v1::CheckpointInfo* info = report.mutable_checkpoint();
    info->set_step(static_cast<uint64_t>(r.step));
    info->set_path(absl::StrFormat("%s/step-%012d", root, r.step));
    info->set_blocking_seconds(r.blocked_seconds);
    info->set_total_seconds(r.total_seconds);
    info->set_bytes(r.bytes);
    Send(report);
  }

  // A checkpoint was not written: the daemon counts it (metrics).
  void OnCheckpointFailed(const CheckpointWriteResult& r) {
    WorkerReport report;
    report.mutable_checkpoint_failed()->set_step(static_cast<uint64_t>(r.step));
    report.mutable_checkpoint_failed()->set_error(std::string(r.status.message()));
    Send(report);
  }

  void OnStarted(const TrainingStarted& started) override {
    parameters_ = started.parameters;
    WorkerReport report;
    report.mutable_started()->set_device(started.device);
    report.mutable_started()->set_parameters(static_cast<uint64_t>(started.parameters));
    Send(report);
    if (report_fd_ < 0 && !quiet_) {
      std::printf("training %lld parameters on %s for %lld steps\n",
                  static_cast<long long>(started.parameters), started.device.c_str(),
                  static_cast<long long>(started.total_steps));
      std::fflush(stdout);
    }
  }

  void OnStep(const StepReport& r) override {
    if (report_fd_ < 0) {
      if (quiet_) return;
      if (r.step == r.total_steps) final_loss_ = r.loss;
      if (r.step == 1 || r.step == r.total_steps || r.step % 10 == 0) {
        std::printf("step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  %.3f s/step\n",
                    static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
                    r.lr, r.tokens_per_second, r.step_seconds);
      }
      if (r.eval.has_value()) {
        std::printf("step %lld/%lld  eval loss %.4f  perplexity %.2f\n", static_cast<long long>(r.step),
                    static_cast<long long>(r.total_steps), r.eval->loss, std::exp(r.eval->loss));
      }
      std::fflush(stdout);
      return;
    }
    if (quiet_) return;  // rank 0 reports the job's progress
    WorkerReport report;
    ferry::v1::Progress* p = report.mutable_progress();
    p->set_step(static_cast<uint64_t>(r.step));
    p->set_total_steps(static_cast<uint64_t>(r.total_steps));
    p->set_loss(r.loss);
    p->set_tokens_per_second(r.tokens_per_second);
    p->set_step_seconds(r.step_seconds);
    p->set_achieved_flops(6.0 * static_cast<double>(parameters_) * r.tokens_per_second);
    p->set_device_memory_bytes(r.device_memory_bytes);
    p->set_host_memory_bytes(r.host_memory_bytes);
    p->set_lr(r.lr);
    p->set_grad_norm(r.grad_norm);
    p->set_tokens(static_cast<uint64_t>(r.tokens));
    p->set_elapsed_seconds(r.elapsed_seconds);
    for (const MemoryUsage& m : r.memory) {
      ferry::v1::MemoryUsage* out = p->add_memory();
      out->set_tier(m.tier);
      out->set_kind(m.kind);
      out->set_bytes(m.bytes);
    }
    for (const MemoryUsage& m : r.capacity) {
      ferry::v1::MemoryUsage* out = p->add_capacity();
      out->set_tier(m.tier);
      out->set_bytes(m.bytes);
    }
    const StepMemoryStats& ms = r.memory_stats;
    p->set_memory_phase(ms.warmup ? "warmup" : "steady");
    p->set_bytes_host_to_device(ms.host_to_device_bytes);
    p->set_bytes_device_to_host(ms.device_to_host_bytes);
    p->set_evictions(static_cast<uint32_t>(ms.evictions));
    p->set_prefetch_hits(static_cast<uint32_t>(ms.prefetch_hits));
    p->set_prefetch_misses(static_cast<uint32_t>(ms.prefetch_misses));
    p->set_prediction_error(ms.prediction_error);
    p->set_device_chunks(static_cast<uint32_t>(ms.device_chunks));
    p->set_host_chunks(static_cast<uint32_t>(ms.host_chunks));
    p->set_device_model_bytes(ms.device_bytes[0] + ms.device_bytes[1] + ms.device_bytes[2]);
    p->set_host_model_bytes(ms.host_bytes[0] + ms.host_bytes[1] + ms.host_bytes[2]);
    p->set_bytes_host_to_disk(ms.host_to_disk_bytes);
    p->set_bytes_disk_to_host(ms.disk_to_host_bytes);
    p->set_disk_chunks(static_cast<uint32_t>(ms.disk_chunks));
    p->set_disk_model_bytes(ms.disk_bytes[0] + ms.disk_bytes[1] + ms.disk_bytes[2]);
    p->set_peak_host_model_bytes(ms.peak_host_model_bytes);
    p->set_loss_scale(r.loss_scale);
    p->set_skipped(r.skipped);
    p->set_skipped_steps(static_cast<uint64_t>(r.skipped_steps));
    for (int block : r.recomputed_blocks) p->add_recomputed_blocks(static_cast<uint32_t>(block));
    ferry::v1::StepTimes* times = p->mutable_step_times();
    times->set_data_seconds(r.times.data);
    times->set_forward_seconds(r.times.forward);
    times->set_backward_seconds(r.times.backward);
    times->set_optimizer_seconds(r.times.optimizer);
    times->set_transfer_seconds(r.times.transfers);
    times->set_disk_seconds(r.times.disk);
    if (r.eval.has_value()) SetEval(*r.eval, p->mutable_eval());
    if (r.initial_eval.has_value()) SetEval(*r.initial_eval, p->mutable_initial_eval());
    last_step_ = static_cast<uint64_t>(r.step);
    final_step_ = r.step == r.total_steps;
    Send(report);
    if (final_step_ && pending_placement_) SendPlacement();
  }

  static void SetEval(const StepReport::Eval& e, ferry::v1::Eval* out) {
    out->set_step(static_cast<uint64_t>(e.step));
    out->set_loss(e.loss);
    out->set_perplexity(std::exp(e.loss));
    out->set_tokens(static_cast<uint64_t>(e.tokens));
    out->set_seconds(e.seconds);
  }

  // Placement goes to the daemon at most once a second, and after the last
  // step.
  void OnPlacement(const PlacementReport& placement) override {
    if (report_fd_ < 0) return;
    placement_ = placement;
    pending_placement_ = true;
    const absl::Time now = absl::Now();
    if (now - last_placement_ >= absl::Seconds(1)) SendPlacement();
  }

  void SendPlacement() {
    WorkerReport report;
    ferry::v1::MemoryPlacement* out = report.mutable_placement();
    out->set_rank(static_cast<uint32_t>(rank_));
    out->set_world_size(static_cast<uint32_t>(world_size_));
    const PlacementReport& r = placement_;
    out->set_step(last_step_ + (final_step_ ? 0 : 1));
    ToProtoTime(absl::Now(), out->mutable_time());
    out->set_device(r.device);
    out->set_policy(r.policy);
    out->set_phase(r.warmup ? "warmup" : "steady");
    out->set_device_capacity_bytes(r.capacity_bytes);
    out->set_device_limit_bytes(r.limit_bytes);
    out->set_host_budget_bytes(r.host_budget_bytes);
    out->set_chunk_size_bytes(static_cast<uint64_t>(r.chunk_elements) * 4);
    out->set_chunk_waste_fraction(r.chunk_waste_fraction);
    out->set_planned_traffic_bytes(r.planned_traffic_bytes);
    out->set_disk_dir(r.disk_dir);
    out->set_disk_budget_bytes(r.disk_budget_bytes);
    out->set_planned_host_bytes(r.planned_host_bytes);
    out->set_planned_disk_bytes(r.planned_disk_bytes);
    out->set_planned_disk_read_bytes(r.planned_disk_read_bytes);
    out->set_planned_disk_write_bytes(r.planned_disk_write_bytes);
    for (int block : r.recomputed_blocks) out->add_recomputed_blocks(static_cast<uint32_t>(block));
    // By tier (device, host, disk) and kind.
    uint64_t totals[3][3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
    for (const PayloadReport& p : r.payloads) {
      ferry::v1::ChunkPlacement* c = out->add_chunks();
      c->set_id(p.id);
      c->set_kind(PayloadKindName(p.kind));
      c->set_chunk(static_cast<uint32_t>(p.chunk));
      c->set_tier(p.tier);
      c->set_bytes(p.bytes);
      c->set_state(p.state);
      c->set_placement(ChunkClassName(p.chunk_class));
      c->set_tensors(static_cast<uint32_t>(p.tensors));
      c->set_home(p.home);
      const int k = static_cast<int>(p.kind);
      totals[0][k] += p.device_bytes;
      totals[1][k] += p.host_bytes;
      totals[2][k] += p.disk_bytes;
    }
    for (int t = 0; t < 3; ++t) {
      // The disk tier only where the job has one.
      if (t == 2 && r.disk_dir.empty()) continue;
      for (int k = 0; k < 3; ++k) {
        ferry::v1::MemoryUsage* u = out->add_totals();
        u->set_tier(TierName(static_cast<Tier>(t)));
        u->set_kind(PayloadKindName(static_cast<PayloadKind>(k)));
        u->set_bytes(totals[t][k]);
      }
    }
    for (const PeriodReport& period : r.trace) {
      ferry::v1::PeriodTrace* t = out->add_trace();
      t->set_name(period.name);
      t->set_non_model_bytes(period.non_model_bytes);
      for (int c : period.chunks) t->add_chunks(static_cast<uint32_t>(c));
      t->set_warmup_non_model_bytes(period.warmup_non_model_bytes);
      t->set_step_non_model_bytes(period.step_non_model_bytes);
      t->set_step_device_model_bytes(period.step_device_model_bytes);
      t->set_evictions(static_cast<uint32_t>(period.evictions));
      t->set_fetches(static_cast<uint32_t>(period.fetches));
      t->set_prefetches(static_cast<uint32_t>(period.prefetches));
    }
    Send(report);
    pending_placement_ = false;
    last_placement_ = absl::Now();
  }

  // Log lines go to stderr (the job's worker.log under the daemon) and, under
  // the daemon, to the job's events.
  void OnLog(LogLevel level, const std::string& message) override {
    std::fprintf(stderr, "%s\n", message.c_str());
    if (report_fd_ < 0) return;
    WorkerReport report;
    report.mutable_log()->set_severity(level == LogLevel::kError     ? ferry::v1::SEVERITY_ERROR
                                       : level == LogLevel::kWarning ? ferry::v1::SEVERITY_WARNING
                                                                     : ferry::v1::SEVERITY_INFO);
    report.mutable_log()->set_message(message);
    Send(report);
  }

  bool StopRequested() override { return stop_.load() || g_signal_stop.load(); }

  void RequestStop() { stop_.store(true); }

  // Standalone: the last step's loss in full, for scripts.
  void PrintFinal() {
    if (report_fd_ < 0 && !quiet_) std::printf("final loss %.8f\n", final_loss_);
  }

  void Finish(Finished::Outcome outcome, const std::string& error) {
    WorkerReport report;
    report.mutable_finished()->set_outcome(outcome);
    report.mutable_finished()->set_error(error);
    Send(report);
  }

 private:
  const int report_fd_;
  const bool quiet_;
  const int rank_;
  const int world_size_;
  double final_loss_ = 0;
  absl::Mutex mu_;  // serialises frames on report_fd_
  std::atomic<bool> stop_{false};
  // Training thread only.
  PlacementReport placement_;
  bool pending_placement_ = false;
  absl::Time last_placement_ = absl::InfinitePast();
  uint64_t last_step_ = 0;
  int64_t parameters_ = 0;  // the whole model's
  bool final_step_ = false;
};

// Reads commands until end of file; a Stop command or EOF asks the trainer
// to stop after its current step.
void ReadCommands(int fd, Reporter* reporter) {
  FrameReader reader;
  std::string payload;
  for (;;) {
    absl::StatusOr<bool> got = reader.ReadFrom(fd, &payload);
    if (!got.ok() || !*got) {
      reporter->RequestStop();
      return;
    }
    ferry::internal::WorkerCommand command;
    if (command.ParseFromString(payload) && command.has_stop()) reporter->RequestStop();
  }
}

int Fail(Reporter& reporter, const absl::Status& status, int code) {
  std::fprintf(stderr, "ferry-worker: %s\n", std::string(status.message()).c_str());
  reporter.Finish(Finished::OUTCOME_FAILED, std::string(status.message()));
  return code;
}


// With checkpoint.on_error: fail, what a failed write ends the run with.
absl::Status CheckpointFailure(const absl::Status& write) {
  if (write.ok()) return write;
  return absl::Status(write.code(), absl::StrCat(write.message(), " (checkpoint.on_error: fail)"));
}

absl::StatusOr<std::unique_ptr<TokenFileSource>> OpenTokenFile(const ferry::v1::JobSpec& spec,
                                                               const AllowedRoots& roots, const std::string& field,
                                                               const std::string& path, uint64_t seed) {
  // Opened inside the allowed roots without following a link, whatever
  // changed since the spec was checked.
  absl::StatusOr<UniqueFd> fd = OpenConfinedFile(roots, field, path);
  if (!fd.ok()) return fd.status();
  return TokenFileSource::FromFd(fd->Release(), path, spec.model().vocab_size(), int64_t{spec.model().seq_len()} + 1,
                                 seed);
}

// The training data and the held-out data (null when the job evaluates
// nothing). A held-out fraction of data.path is its last tokens: training
// draws its windows from the rest, evaluation from them.
struct Sources {
  std::unique_ptr<TokenSource> train;
  std::unique_ptr<TokenSource> eval;
};

absl::StatusOr<Sources> MakeSources(const ferry::v1::JobSpec& spec, const AllowedRoots& roots) {
  const ferry::v1::DataSpec& data = spec.data();
  // The held-out windows are drawn with a seed of their own, the same on
  // every rank.
  const uint64_t eval_seed = spec.train().seed() ^ 0x9e3779b97f4a7c15ull;
  Sources sources;
  if (data.has_synthetic()) {
    sources.train = std::make_unique<SyntheticSource>(spec.model().vocab_size(), data.synthetic().branching(),
                                                      data.synthetic().seed(), spec.train().seed());
    if (!data.eval().has_path() && spec.train().eval_every_steps() > 0) {
      // Fresh sequences of the same chain.
      sources.eval = std::make_unique<SyntheticSource>(spec.model().vocab_size(), data.synthetic().branching(),
                                                       data.synthetic().seed(), eval_seed);
    }
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<TokenFileSource> train,
                     OpenTokenFile(spec, roots, "data.path", data.path(), spec.train().seed()));
    if (data.eval().has_held_out_fraction()) {
      ASSIGN_OR_RETURN(std::unique_ptr<TokenFileSource> held_out,
                       OpenTokenFile(spec, roots, "data.path", data.path(), eval_seed));
      const int64_t n = train->token_count();
      const int64_t split = n - HeldOutTokens(n, data.eval().held_out_fraction());
      const int64_t window = int64_t{spec.model().seq_len()} + 1;
      absl::Status s = train->Restrict(0, split, window);
      if (s.ok()) s = held_out->Restrict(split, n, window);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("data.eval.held_out_fraction: ", s.message()));
      sources.eval = std::move(held_out);
    }
    sources.train = std::move(train);
  }
  if (data.eval().has_path()) {
    ASSIGN_OR_RETURN(sources.eval, OpenTokenFile(spec, roots, "data.eval.path", data.eval().path(), eval_seed));
  }
  return sources;
}

}  // namespace

int RunWorker(const WorkerOptions& options) {
  signal(SIGTERM, OnStopSignal);
  signal(SIGINT, OnStopSignal);
  signal(SIGPIPE, SIG_IGN);
  // Never freed: the command reader below may still be blocked reading it
  // while the process exits.
  const bool launched = options.world_size > 1;
  Reporter& reporter =
      *new Reporter(options.report_fd, /*quiet=*/options.rank != 0, options.rank, options.world_size);
  if (options.report_fd >= 0) {
    std::thread(ReadCommands, options.command_fd, &reporter).detach();
  }

  absl::StatusOr<ferry::v1::JobSpec> parsed = LoadJobFile(options.spec_path);
  if (!parsed.ok()) return Fail(reporter, parsed.status(), kWorkerBadUsage);
  absl::StatusOr<ferry::v1::JobSpec> spec = WithDefaults(*parsed);
  if (!spec.ok()) return Fail(reporter, spec.status(), kWorkerBadUsage);
  MachineFacts machine;
  machine.host_memory_bytes = HostMemoryTotalBytes();
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(options.allowed_roots);
  if (!roots.ok()) {
    return Fail(reporter, absl::InvalidArgumentError(absl::StrCat("--allowed_roots: ", roots.status().message())),
                kWorkerBadUsage);
  }
  machine.allowed_roots = *roots;
  // Under ferryd every rank runs on this machine and shares its memory and
  // disk, as the daemon assumed when it accepted the job.
  machine.ranks_share_host = options.report_fd >= 0;
  // Under a launcher, "auto" is this rank's GPU (LOCAL_RANK) where there are
  // GPUs, else the CPU.
  std::string device_name = options.device;
  if (launched && device_name == "auto") {
    absl::StatusOr<c10::Device> resolved = ResolveDevice("auto");
    if (resolved.ok() && resolved->is_cuda()) device_name = absl::StrCat("cuda:", options.local_rank);
  }
  // Without a GPU the (simulated) device is host memory: the host budget's
  // default leaves it out, as the daemon's check did.
  if (absl::StatusOr<c10::Device> resolved = ResolveDevice(device_name); resolved.ok()) {
    machine.device_is_host_memory = !resolved->is_cuda();
  }
  // The disk tier: this rank's own directory, emptied of what a run killed
  // before this one left, before the validator looks at its free space.
  std::string disk_dir;
  {
    const std::string job_disk_dir =
        JobDiskDir(*spec, options.job_id.empty() ? TrainingFingerprint(*spec) : options.job_id, options.job_dir);
    if (!job_disk_dir.empty()) {
      disk_dir = RankDiskDir(job_disk_dir, options.rank);
      if (absl::Status s = PrepareRankDiskDir(*spec, disk_dir, *roots); !s.ok()) {
        return Fail(reporter, s, kWorkerFailed);
      }
      machine.default_disk_dir = disk_dir;
    }
  }
  // Under a launcher the spec comes as written: its model may still be read
  // from model.init_from (the daemon's spec has it filled in already).
  if (absl::Status s = ResolveModelFromWeights(&*spec, machine); !s.ok()) {
    return Fail(reporter, s, kWorkerBadUsage);
  }
  if (absl::Status s = ValidateSpec(*spec, machine); !s.ok()) {
    return Fail(reporter, s, kWorkerBadUsage);
  }
  const int tensor = static_cast<int>(spec->parallel().tensor());
  const int data = static_cast<int>(spec->parallel().data());
  if (tensor * data != options.world_size) {
    return Fail(reporter,
                absl::InvalidArgumentError(absl::StrCat(
                    "parallel: the job has ", tensor, " x ", data, " ranks (parallel.tensor x parallel.data) but ",
                    "WORLD_SIZE is ", options.world_size, "; start one ferry-worker per rank")),
                kWorkerBadUsage);
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return Fail(reporter,
                absl::InvalidArgumentError(absl::StrCat("RANK: ", options.rank, " is not below WORLD_SIZE (",
                                                        options.world_size, ")")),
                kWorkerBadUsage);
  }
  absl::StatusOr<std::unique_ptr<MemoryDevice>> device =
      MakeMemoryDevice(device_name, spec->memory().device_budget());
  if (!device.ok()) return Fail(reporter, device.status(), kWorkerBadUsage);
  absl::StatusOr<Sources> sources = MakeSources(*spec, *roots);
  if (!sources.ok()) return Fail(reporter, sources.status(), kWorkerFailed);

  EngineOptions engine;
  engine.device = device->get();
  engine.init_from = spec->model().init_from();
  engine.eval_data = sources->eval.get();
  // The budgets the daemon checked the job against, their defaults filled
  // in the same way, and this rank's directory for the disk tier.
  std::string disk_warning;
  const JobEngineSetup setup = SetUpJobEngine(*spec, EngineUse::kTrain, machine, disk_dir, &disk_warning);
  engine.memory = setup.memory;
  if (!disk_warning.empty()) reporter.OnLog(LogLevel::kWarning, disk_warning);
  ParallelGroups groups;
  if (launched) {
    const std::chrono::seconds timeout(options.collective_timeout_seconds);
    absl::StatusOr<c10::intrusive_ptr<c10d::Store>> store =
        MakeTcpStore(options.master_addr, static_cast<uint16_t>(options.master_port), options.rank,
                     options.world_size, timeout);
    if (!store.ok()) return Fail(reporter, store.status(), kWorkerFailed);
    CommunicatorOptions comm;
    comm.timeout = timeout;
    // NCCL for GPU tensors, Gloo for CPU ones.
    comm.backend = (*device)->compute_device().is_cuda() ? CommunicatorOptions::Backend::kNccl
                                                         : CommunicatorOptions::Backend::kGloo;
    // Gloo binds where the other ranks can reach this one: loopback when
    // they are all on this machine, else this host's name.
    const bool local = options.master_addr == "127.0.0.1" || options.master_addr == "localhost";
    comm.gloo_hostname = local ? "127.0.0.1" : "";
    absl::StatusOr<ParallelGroups> joined = JoinParallelGroups(
        PrefixedStore(absl::StrCat("ferry/", spec->name()), *store), options.rank, tensor, data, comm);
    if (!joined.ok()) return Fail(reporter, joined.status(), kWorkerFailed);
    groups = std::move(*joined);
    engine.tensor = groups.tensor.get();
    engine.data = groups.data.get();
  }
  // Checkpoints: each rank in its own directory under checkpoint.dir;
  // resume from the newest one that verifies, if it is this job's.
  std::optional<CheckpointContents> resume;
  std::unique_ptr<AsyncCheckpointWriter> writer;
  const ferry::v1::CheckpointSpec& checkpoint = spec->checkpoint();
  const bool checkpoint_errors_fail = checkpoint.on_error() == ferry::v1::CHECKPOINT_ON_ERROR_FAIL;
  if (!checkpoint.dir().empty()) {
    const std::string root = absl::StrCat(checkpoint.dir(), "/rank", options.rank);
    const std::string fingerprint = TrainingFingerprint(*spec);
    // Under allowed roots the rank's directory is opened (created) once,
    // beneath its root without following links, and every checkpoint is
    // read and written through that descriptor: a link put in its place, or
    // inside it, later cannot lead the writes outside.
    std::shared_ptr<UniqueFd> root_fd;
    if (roots->confined()) {
      absl::StatusOr<UniqueFd> opened = OpenConfinedDir(*roots, "checkpoint.dir", root, /*create=*/true);
      if (!opened.ok()) return Fail(reporter, opened.status(), kWorkerFailed);
      root_fd = std::make_shared<UniqueFd>(*std::move(opened));
    }
    absl::StatusOr<LoadedCheckpoint> loaded =
        root_fd ? LoadLatestCheckpointIn(root_fd->get(), root) : LoadLatestCheckpoint(root);
    if (launched && (loaded.ok() || absl::IsNotFound(loaded.status()))) {
      // Ranks resume from the same step: the newest every rank has (one
      // killed while writing may lack the others' newest).
      const int64_t newest = loaded.ok() ? loaded->contents.step : -1;
      int64_t common = newest;
      try {
        at::Tensor agreed = at::full({1}, -newest, at::TensorOptions().dtype(at::kLong).device(
                                                        (*device)->compute_device()));
        groups.tensor->AllReduce(agreed, ReduceOp::kMax);
        groups.data->AllReduce(agreed, ReduceOp::kMax);
        common = -agreed.item<int64_t>();
      } catch (const std::exception& e) {
        return Fail(reporter, absl::UnavailableError(absl::StrCat("checkpoint: agreeing on a step: ", e.what())),
                    kWorkerFailed);
      }
      if (common != newest) {
        reporter.OnLog(LogLevel::kWarning,
                       absl::StrCat("checkpoint: this rank's newest is step ", newest, ", another rank's only ",
                                    common < 0 ? std::string("none") : absl::StrCat("step ", common),
                                    "; resuming where every rank can"));
        if (common < 0) {
          loaded = absl::NotFoundError("no checkpoint every rank has");
        } else {
          std::vector<std::string> skipped = std::move(loaded->skipped);
          loaded = root_fd ? LoadCheckpointIn(root_fd->get(), root, common) : LoadCheckpointAt(root, common);
          if (!loaded.ok()) {
            return Fail(reporter,
                        absl::FailedPreconditionError(absl::StrCat(
                            "checkpoint.dir: another rank can resume only from step ", common, ", which this rank ",
                            "no longer has (", loaded.status().message(), "); raise checkpoint.keep, or start ",
                            "afresh with an empty directory")),
                        kWorkerFailed);
          }
          loaded->skipped = std::move(skipped);
        }
      }
    }
    if (loaded.ok()) {
      for (const std::string& why : loaded->skipped) {
        reporter.OnLog(LogLevel::kWarning, absl::StrCat("checkpoint: skipped ", why));
      }
      if (loaded->contents.meta["training"] != fingerprint) {
        return Fail(reporter,
                    absl::FailedPreconditionError(absl::StrCat(
                        "checkpoint.dir: ", checkpoint.dir(), " holds a checkpoint of another training (the model, ",
                        "data, train or parallel settings differ); use an empty directory")),
                    kWorkerBadUsage);
      }
      reporter.OnLog(LogLevel::kInfo, absl::StrCat("checkpoint: resuming after step ", loaded->contents.step,
                                                   " from ", loaded->path));
      resume = std::move(loaded->contents);
      engine.resume = &*resume;
    } else if (!absl::IsNotFound(loaded.status())) {
      return Fail(reporter, loaded.status(), kWorkerFailed);
    } else if (loaded.status().message().find("skipped") != std::string::npos) {
      reporter.OnLog(LogLevel::kWarning, std::string(loaded.status().message()));
    }
    engine.checkpoint_every_steps = static_cast<int64_t>(checkpoint.every_steps());
    const int keep = static_cast<int>(checkpoint.keep());
    // The step loop waits only for the snapshot (and for the previous
    // write, if that is still running); the files are written in the
    // background while training goes on.
    writer = std::make_unique<AsyncCheckpointWriter>(
        [root, keep, root_fd](const CheckpointContents& c) {
          return root_fd ? WriteCheckpointIn(root_fd->get(), root, c, keep) : WriteCheckpoint(root, c, keep);
        },
        [root, newest = resume ? resume->step : int64_t{-1}, fail = checkpoint_errors_fail,
         &reporter](const CheckpointWriteResult& r) mutable {
          if (r.status.ok()) {
            newest = r.step;
            reporter.OnLog(LogLevel::kInfo,
                           absl::StrFormat("checkpoint: step %d written to %s in %.2f s (blocked training %.3f s)",
                                           r.step, root, r.total_seconds, r.blocked_seconds));
            reporter.OnCheckpoint(r, root);
            return;
          }
          reporter.OnCheckpointFailed(r);
          reporter.OnLog(fail ? LogLevel::kError : LogLevel::kWarning,
                         absl::StrCat("checkpoint: step ", r.step, " not written: ",
                                      absl::StripPrefix(r.status.message(), "checkpoint: "), "; ",
                                      newest >= 0 ? absl::StrCat("the newest checkpoint is still step ", newest)
                                                  : std::string("there is no checkpoint yet"),
                                      fail ? "; the run fails (checkpoint.on_error: fail)" : "; training continues"));
        });
    engine.on_checkpoint = [fingerprint, fail = checkpoint_errors_fail, w = writer.get()](
                               CheckpointContents c, double snapshot_seconds) -> absl::Status {
      c.meta["training"] = fingerprint;
      const absl::Status previous = w->Submit(std::move(c), snapshot_seconds);
      return fail ? CheckpointFailure(previous) : absl::OkStatus();
    };
  }
  Trainer trainer(setup.model, setup.train, engine, std::move(sources->train), &reporter);
  absl::Status status = trainer.Run();
  // Ranks leave together: none closes its connections while a peer's last
  // messages are in flight.
  if (launched && (status.ok() || absl::IsCancelled(status))) {
    if (absl::Status s = FinishParallelGroups(groups); !s.ok()) status = s;
  }
  // The last checkpoint (after the last step, or at a stop) is complete
  // before the worker reports and exits.
  if (writer != nullptr) {
    const absl::Status written = writer->Wait();
    if (checkpoint_errors_fail && (status.ok() || absl::IsCancelled(status))) {
      if (absl::Status s = CheckpointFailure(written); !s.ok()) status = s;
    }
  }
  if (status.ok()) {
    reporter.Finish(Finished::OUTCOME_SUCCEEDED, "");
    reporter.PrintFinal();
    return kWorkerSucceeded;
  }
  if (absl::IsCancelled(status)) {
    reporter.Finish(Finished::OUTCOME_CANCELLED, std::string(status.message()));
    if (options.report_fd < 0) std::printf("%s\n", std::string(status.message()).c_str());
    return kWorkerCancelled;
  }
  return Fail(reporter, status, kWorkerFailed);
}

int RunProbe() {
  ferry::internal::DeviceProbe probe;
  for (const DeviceDescription& d : ProbeDevices()) {
    ferry::v1::Device* out = probe.add_devices();
    out->set_kind(d.kind);
    out->set_name(d.name);
    out->set_description(d.description);
    out->set_memory_bytes(d.memory_bytes);
    // The device's matrix-product rate, for `ferry top` to set a job's
    // achieved rate beside: every host CPU for the CPU.
    absl::StatusOr<c10::Device> device = ResolveDevice(d.name);
    if (device.ok()) {
      if (device->is_cpu()) at::set_num_threads(HostCpuCount());
      out->set_fp32_matmul_flops(MeasureMatmulFlops(*device, at::kFloat));
      out->set_bf16_matmul_flops(MeasureMatmulFlops(*device, at::kBFloat16));
    }
  }
  probe.set_torch_version(TorchVersion());
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(probe, &json).ok()) return kWorkerFailed;
  std::printf("%s\n", json.c_str());
  return kWorkerSucceeded;
}

}  // namespace ferry
