#include "server/spec/spec_validator.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/safe_path.h"
#include "engine/common/status_macros.h"
#include "engine/checkpoint/model_files.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/data/token_file.h"
#include "engine/memory/chunk_layout.h"
#include "engine/model/gpt2_weights.h"
#include "engine/model/hf_layout.h"
#include "engine/model/model_config.h"
#include "ferry/v1/options.pb.h"
#include "server/spec/size.h"
#include "server/spec/spec_defaults.h"
#include "server/spec/yaml_to_proto.h"

namespace ferry {
namespace {

using ferry::v1::JobSpec;

constexpr uint32_t kMaxNameLength = 128;
constexpr uint32_t kMaxPathLength = 4096;

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
uint64_t SaturatingMul(uint64_t a, uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

// Problems found, each with the code it calls for.
class Problems {
 public:
  void Invalid(std::string message) { invalid_.push_back(std::move(message)); }
  void Precondition(std::string message) { precondition_.push_back(std::move(message)); }
  void Unimplemented(std::string message) { unimplemented_.push_back(std::move(message)); }
  void Denied(std::string message) { denied_.push_back(std::move(message)); }
  // A status's message under the problem its code calls for.
  void Add(const absl::Status& s) {
    switch (s.code()) {
      case absl::StatusCode::kOk:
        return;
      case absl::StatusCode::kInvalidArgument:
        return Invalid(std::string(s.message()));
      case absl::StatusCode::kPermissionDenied:
        return Denied(std::string(s.message()));
      default:
        return Precondition(std::string(s.message()));
    }
  }

  template <typename T>
  void Range(const char* field, T value, T low, T high, absl::string_view hint = "") {
    if (value < low || value > high) {
      Invalid(absl::StrCat(field, ": ", value, " is out of range; use ", low, " to ", high,
                           hint.empty() ? "" : " ", hint));
    }
  }

  bool empty() const {
    return invalid_.empty() && denied_.empty() && precondition_.empty() && unimplemented_.empty();
  }

  void Append(const Problems& other) {
    invalid_.insert(invalid_.end(), other.invalid_.begin(), other.invalid_.end());
    denied_.insert(denied_.end(), other.denied_.begin(), other.denied_.end());
    precondition_.insert(precondition_.end(), other.precondition_.begin(), other.precondition_.end());
    unimplemented_.insert(unimplemented_.end(), other.unimplemented_.begin(),
                          other.unimplemented_.end());
  }

  absl::Status ToStatus() const {
    std::vector<std::string> all = invalid_;
    all.insert(all.end(), denied_.begin(), denied_.end());
    all.insert(all.end(), precondition_.begin(), precondition_.end());
    all.insert(all.end(), unimplemented_.begin(), unimplemented_.end());
    if (all.empty()) return absl::OkStatus();
    const std::string message = absl::StrJoin(all, "; ");
    if (!invalid_.empty()) return absl::InvalidArgumentError(message);
    if (!denied_.empty()) return absl::PermissionDeniedError(message);
    if (!precondition_.empty()) return absl::FailedPreconditionError(message);
    return absl::UnimplementedError(message);
  }

 private:
  std::vector<std::string> invalid_;
  std::vector<std::string> denied_;
  std::vector<std::string> precondition_;
  std::vector<std::string> unimplemented_;
};

// True when the path is well formed and, with machine.check_files, leads
// inside machine.allowed_roots to no device file, FIFO or socket: the file
// system may be looked at further.
bool CheckPath(Problems& p, const char* field, const std::string& path, PathKind kind,
               const MachineFacts& machine) {
  if (path.size() > kMaxPathLength) {
    p.Invalid(absl::StrCat(field, ": ", path.size(), " characters, longer than ", kMaxPathLength,
                           " (PATH_MAX); use a shorter path"));
    return false;
  }
  if (path.find('\0') != std::string::npos) {
    p.Invalid(absl::StrCat(field, ": contains a NUL character; give a plain path"));
    return false;
  }
  if (path[0] != '/') {
    p.Invalid(absl::StrCat(field, ": '", path,
                           "' must be an absolute path (the ferry CLI resolves relative paths "
                           "against the job file's directory)"));
    return false;
  }
  if (!machine.check_files) return true;
  const absl::Status confined = CheckConfined(machine.allowed_roots, field, path, kind).status();
  p.Add(confined);
  return confined.ok();
}

// Ranks of the job on this machine: all of them when ferryd runs them, else
// (one rank under a launcher) this one.
uint64_t RanksHere(const JobSpec& spec, const MachineFacts& machine) {
  if (!machine.ranks_share_host) return 1;
  return SaturatingMul(std::max<uint32_t>(1, spec.parallel().tensor()), std::max<uint32_t>(1, spec.parallel().data()));
}

// Host memory one rank's simulated device takes (0 on a GPU): its budget,
// or the quarter of host memory MakeMemoryDevice gives it by default.
uint64_t SimulatedDeviceBytes(const JobSpec& spec, const MachineFacts& machine) {
  if (!machine.device_is_host_memory) return 0;
  return spec.memory().device_budget() > 0 ? spec.memory().device_budget() : machine.host_memory_bytes / 4;
}

// True when the model is well formed.
bool CheckModel(Problems& p, const ferry::v1::ModelSpec& m) {
  Problems local;
  local.Range("model.layers", m.layers(), 1u, 1024u);
  local.Range("model.hidden", m.hidden(), 1u, 65536u);
  local.Range("model.heads", m.heads(), 1u, 1024u);
  local.Range("model.vocab_size", m.vocab_size(), 2u, 1u << 24);
  local.Range("model.seq_len", m.seq_len(), 1u, 1u << 20);
  if (m.heads() > 0 && m.hidden() % m.heads() != 0) {
    local.Invalid(absl::StrCat("model.hidden: ", m.hidden(), " is not a multiple of model.heads (",
                           m.heads(), "); choose hidden = heads x head size"));
  }
  if (!(m.dropout() >= 0.0 && m.dropout() < 1.0)) {
    local.Invalid(absl::StrCat("model.dropout: ", m.dropout(), " is out of range; use 0 to below 1"));
  }
  // The architecture's sizes, within what a model can be (so that no size
  // overflows), and its numbers finite.
  const ferry::v1::ModelArchitecture& a = m.architecture();
  local.Range("model.architecture.kv_heads", a.kv_heads(), 0u, 1024u);
  local.Range("model.architecture.head_dim", a.head_dim(), 0u, 65536u);
  local.Range("model.architecture.intermediate", a.intermediate(), 0u, 1u << 20);
  local.Range("model.architecture.rope_original_max_positions", a.rope_original_max_positions(), 0u, 1u << 31);
  for (const auto& [field, value, most] : std::vector<std::tuple<const char*, double, double>>{
           {"model.architecture.norm_eps", a.norm_eps(), 1.0},
           {"model.architecture.rope_theta", a.rope_theta(), 1e12},
           {"model.architecture.rope_factor", a.rope_factor(), 1e9},
           {"model.architecture.rope_low_freq_factor", a.rope_low_freq_factor(), 1e9},
           {"model.architecture.rope_high_freq_factor", a.rope_high_freq_factor(), 1e9}}) {
    if (!(value >= 0 && value <= most)) {
      local.Invalid(absl::StrCat(field, ": ", value, " is out of range; use 0 (the default) to ", most));
    }
  }
  const std::string& type = a.model_type();
  if (absl::StatusOr<ModelConfig> family = ModelFamily(type.empty() ? "gpt2" : type); !family.ok()) {
    local.Invalid(absl::StrCat("model.architecture.model_type: ", family.status().message()));
  } else if (local.empty()) {
    // The architecture holds together (key/value heads, head size, context
    // within the model's positions, rope scaling).
    if (absl::Status s = CheckModelConfig(ToModelConfig(m)); !s.ok()) local.Invalid(std::string(s.message()));
  }
  const bool ok = local.empty();
  p.Append(local);
  return ok;
}

// A token file named by `field`: confined like every path, and where files
// are checked, readable, of the model's vocabulary and at least one window
// long. Its token count, or -1 when not known (unchecked or refused).
int64_t CheckTokenFile(Problems& p, const std::string& field, const std::string& path, const JobSpec& spec,
                       const MachineFacts& machine) {
  const uint64_t window = uint64_t{spec.model().seq_len()} + 1;
  if (path.empty()) {
    p.Invalid(absl::StrCat(field, ": is empty; give a token file written by `ferry data prepare`"));
    return -1;
  }
  const bool path_ok = CheckPath(p, field.c_str(), path, PathKind::kFile, machine);
  if (!machine.check_files || !path_ok) return -1;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    p.Precondition(absl::StrCat(field, ": ", path,
                                " does not exist on the daemon's machine; create it with "
                                "`ferry data prepare TEXT_FILES -o ", path, "`"));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    p.Precondition(absl::StrCat(field, ": ", path, " is not a regular file"));
    return -1;
  }
  // The header, read as the worker will open the file.
  absl::StatusOr<UniqueFd> fd = OpenConfinedFile(machine.allowed_roots, field, path);
  if (!fd.ok()) {
    p.Add(fd.status());
    return -1;
  }
  absl::StatusOr<TokenFileInfo> info = ReadTokenFileInfo(fd->get(), path);
  if (!info.ok()) {
    p.Add(absl::Status(info.status().code(), absl::StrCat(field, ": ", info.status().message())));
    return -1;
  }
  const uint32_t model_vocab = spec.model().vocab_size();
  if (model_vocab > 0 && info->vocab_size > model_vocab) {
    p.Invalid(absl::StrCat(field, ": ", path, " was tokenised (", info->tokenizer.kind, ") with a vocabulary of ",
                           info->vocab_size, ", larger than model.vocab_size ", model_vocab,
                           "; set model.vocab_size to at least ", info->vocab_size,
                           ", or prepare the data with the model's tokenizer"));
  }
  if (static_cast<uint64_t>(info->token_count) < window) {
    p.Precondition(absl::StrCat(field, ": ", path, " holds ", info->token_count,
                                " tokens, fewer than one window of model.seq_len + 1 = ", window,
                                "; use more data or a shorter seq_len"));
    return -1;
  }
  return info->token_count;
}

void CheckEval(Problems& p, const JobSpec& spec, int64_t train_tokens, const MachineFacts& machine) {
  const ferry::v1::EvalData& eval = spec.data().eval();
  switch (eval.source_case()) {
    case ferry::v1::EvalData::SOURCE_NOT_SET:
      if (spec.data().has_eval()) {
        p.Invalid("data.eval: set path (a token file) or held_out_fraction (a part of data.path)");
      } else if (spec.train().eval_every_steps() > 0 && !spec.data().has_synthetic()) {
        p.Invalid(absl::StrCat("train.eval_every_steps: ", spec.train().eval_every_steps(),
                               " but there is no held-out data; set data.eval.path or "
                               "data.eval.held_out_fraction"));
      }
      return;
    case ferry::v1::EvalData::kPath:
      CheckTokenFile(p, "data.eval.path", eval.path(), spec, machine);
      return;
    case ferry::v1::EvalData::kHeldOutFraction:
      break;
  }
  const double fraction = eval.held_out_fraction();
  if (!spec.data().has_path()) {
    p.Invalid("data.eval.held_out_fraction: holds out part of data.path, and there is none; synthetic data "
              "is evaluated on fresh sequences of its chain: remove data.eval and set train.eval_every_steps");
    return;
  }
  if (!(fraction > 0 && fraction <= 0.5)) {
    p.Invalid(absl::StrCat("data.eval.held_out_fraction: ", fraction, " must be above 0 and at most 0.5"));
    return;
  }
  if (train_tokens < 0) return;
  const int64_t window = int64_t{spec.model().seq_len()} + 1;
  const int64_t held_out = HeldOutTokens(train_tokens, fraction);
  if (held_out < window || train_tokens - held_out < window) {
    p.Precondition(absl::StrCat("data.eval.held_out_fraction: ", fraction, " of data.path's ", train_tokens,
                                " tokens leaves ", held_out, " held out and ", train_tokens - held_out,
                                " for training; each part needs a window of model.seq_len + 1 = ", window,
                                " tokens: use more data, another fraction or a shorter seq_len"));
  }
}

void CheckData(Problems& p, const JobSpec& spec, const MachineFacts& machine) {
  const ferry::v1::DataSpec& data = spec.data();
  int64_t train_tokens = -1;
  switch (data.source_case()) {
    case ferry::v1::DataSpec::SOURCE_NOT_SET:
      p.Invalid("data: set path (a token file from `ferry data prepare`) or synthetic: {}");
      return;
    case ferry::v1::DataSpec::kSynthetic: {
      const uint32_t branching = data.synthetic().branching();
      // (A vocabulary still to be read from model.init_from is 0 here.)
      if (branching < 1 || (spec.model().vocab_size() > 0 && branching >= spec.model().vocab_size())) {
        p.Invalid(absl::StrCat("data.synthetic.branching: ", branching,
                               " must be at least 1 and below model.vocab_size (",
                               spec.model().vocab_size(), ")"));
      }
      break;
    }
    case ferry::v1::DataSpec::kPath:
      train_tokens = CheckTokenFile(p, "data.path", data.path(), spec, machine);
      break;
  }
  CheckEval(p, spec, train_tokens, machine);
}

void CheckTrain(Problems& p, const ferry::v1::TrainSpec& t) {
  p.Range<uint64_t>("train.steps", t.steps(), 1, 1000000000);
  p.Range<uint32_t>("train.eval_batches", t.eval_batches(), 1, 1000);
  p.Range<uint32_t>("train.batch_size", t.batch_size(), 1, 65536);
  p.Range<uint32_t>("train.grad_accum_steps", t.grad_accum_steps(), 1, 65536);
  if (t.grad_accum_steps() > 0 && t.batch_size() % t.grad_accum_steps() != 0) {
    p.Invalid(absl::StrCat("train.grad_accum_steps: ", t.grad_accum_steps(),
                           " micro-batches do not split train.batch_size ", t.batch_size(),
                           "; use a train.grad_accum_steps that divides it, or a train.batch_size that is a "
                           "multiple of it"));
  }
  if (!(t.lr() > 0 && t.lr() <= 10)) {
    p.Invalid(absl::StrCat("train.lr: ", t.lr(), " is out of range; use a value above 0, "
                           "typically 1e-4 to 3e-3"));
  }
  if (!(t.min_lr() >= 0 && t.min_lr() <= t.lr())) {
    p.Invalid(absl::StrCat("train.min_lr: ", t.min_lr(), " must be between 0 and train.lr (",
                           t.lr(), ")"));
  }
  if (t.warmup_steps() > t.steps()) {
    p.Invalid(absl::StrCat("train.warmup_steps: ", t.warmup_steps(),
                           " is more than train.steps (", t.steps(), ")"));
  }
  if (!(t.weight_decay() >= 0 && t.weight_decay() < 10)) {
    p.Invalid(absl::StrCat("train.weight_decay: ", t.weight_decay(),
                           " is out of range; use 0 or more, typically 0.1"));
  }
  if (!(t.grad_clip() >= 0 && std::isfinite(t.grad_clip()))) {
    p.Invalid(absl::StrCat("train.grad_clip: ", t.grad_clip(), " must be 0 (off) or a positive finite number"));
  }
  if (!(t.beta1() >= 0 && t.beta1() < 1)) {
    p.Invalid(absl::StrCat("train.beta1: ", t.beta1(), " must be in [0, 1)"));
  }
  if (!(t.beta2() >= 0 && t.beta2() < 1)) {
    p.Invalid(absl::StrCat("train.beta2: ", t.beta2(), " must be in [0, 1)"));
  }
  if (!(t.eps() > 0 && t.eps() < 1)) {
    p.Invalid(absl::StrCat("train.eps: ", t.eps(), " must be in (0, 1), typically 1e-8"));
  }
  p.Range<uint32_t>("train.threads", t.threads(), 0, 1024, "(0 means one per core)");
  if (!(t.loss_scale() >= 1 && t.loss_scale() <= 4294967296.0)) {
    p.Invalid(absl::StrCat("train.loss_scale: ", t.loss_scale(), " is out of range; use 1 to 2^32 (4294967296)"));
  }
}


// One rank's chunks, laid out as the trainer asks the chunk manager to lay
// them out: chunk_size, or a search over multiples of the hidden size; each
// capacity padded to whole shards where the job shards its chunks.
struct RankChunks {
  ModelConfig config;
  std::vector<ParameterShape> shapes;
  ChunkLayout layout;
  // Per chunk: the elements of a data rank's shard of it.
  std::vector<int64_t> shard;
  MemoryOptions options;
  bool mixed = false;
  int tensor = 1;
};

absl::StatusOr<RankChunks> LayRankChunks(const JobSpec& spec) {
  RankChunks r;
  r.config = ToModelConfig(spec.model());
  r.tensor = static_cast<int>(std::max<uint32_t>(1, spec.parallel().tensor()));
  r.shapes = ModelParameterShapes(r.config, r.tensor);
  std::vector<int64_t> numels;
  std::vector<int> groups;
  for (const ParameterShape& shape : r.shapes) {
    numels.push_back(shape.numel);
    groups.push_back(shape.stage);
  }
  r.options = ToMemoryOptions(spec);
  ChunkSearchOptions search;
  search.step_elements = r.options.chunk_step_elements > 0 ? r.options.chunk_step_elements : r.config.hidden;
  search.max_chunks = r.options.max_chunks;
  absl::StatusOr<ChunkLayout> layout = ChooseChunkLayout(numels, groups, r.options.chunk_elements, search);
  if (!layout.ok()) return layout.status();
  r.layout = *std::move(layout);
  r.mixed = spec.train().precision() == ferry::v1::PRECISION_FP16 ||
            spec.train().precision() == ferry::v1::PRECISION_BF16;
  // Sharded (parallel.shard), a rank keeps 1/D of the optimizer states;
  // fully sharded, of the weights and gradients too.
  const int64_t data = static_cast<int64_t>(std::max<uint32_t>(1, spec.parallel().data()));
  const bool sharded = r.options.shard != MemoryOptions::Shard::kNone;
  r.shard = ShardChunks(&r.layout.capacity, sharded ? data : 1);
  return r;
}


// RankDevicePlanInput's input from the chunks.
PlanInput DevicePlanInput(const RankChunks& chunks, const JobSpec& spec, uint64_t limit_bytes) {
  // Stages as the trainer forms them, each period's chunks those of its
  // stage's parameters.
  const std::vector<std::vector<int>> uses = ModelStageParameters(chunks.config, chunks.shapes, chunks.tensor);
  const int stages = static_cast<int>(uses.size());
  PlanInput in;
  in.limit_bytes = limit_bytes;
  in.forward_periods = stages;
  in.backward_periods = stages;
  in.accumulates = spec.train().grad_accum_steps() > 1;
  in.period_chunks.assign(static_cast<size_t>(2 * stages + 1), {});
  for (int s = 0; s < stages; ++s) {
    std::set<int> used;
    for (int i : uses[static_cast<size_t>(s)]) used.insert(chunks.layout.slots[static_cast<size_t>(i)].chunk);
    in.period_chunks[static_cast<size_t>(s)].assign(used.begin(), used.end());
    in.period_chunks[static_cast<size_t>(2 * stages - 1 - s)].assign(used.begin(), used.end());
  }
  in.non_model_bytes.assign(in.period_chunks.size(), 0);
  const uint64_t element = chunks.mixed ? 2 : 4;
  for (int64_t capacity : chunks.layout.capacity) {
    // The weights are whole on the device, fully sharded too (gathered).
    in.param_bytes.push_back(SaturatingMul(static_cast<uint64_t>(capacity), element));
  }
  return in;
}

// RankTierInput's input from the chunks.
TierInput TierPlanInput(const RankChunks& chunks, const JobSpec& spec) {
  TierInput input = ChunkTierInput(chunks.layout.capacity, chunks.mixed);
  input.optimizer_elements = chunks.shard;
  if (chunks.options.shard == MemoryOptions::Shard::kFull) input.host_elements = chunks.shard;
  input.micro_batches = static_cast<int>(std::clamp<uint32_t>(spec.train().grad_accum_steps(), 1, 1 << 20));
  // The model is built without its values, which are drawn into the
  // chunks a parameter at a time, in place; a tensor-parallel shard is
  // drawn whole in fp32 first (a shard's tensor across the group, at most).
  if (chunks.tensor > 1) {
    int64_t largest = 0;
    for (const ParameterShape& shape : chunks.shapes) largest = std::max(largest, shape.numel);
    input.init_scratch_bytes =
        SaturatingMul(SaturatingMul(static_cast<uint64_t>(largest), chunks.tensor), 4);
  }
  return input;
}

// The device a rank runs on, in bytes; 0 when not known.
uint64_t RankDeviceBytes(const JobSpec& spec, const MachineFacts& machine) {
  if (machine.device_is_host_memory) return SimulatedDeviceBytes(spec, machine);
  return spec.memory().device_budget() > 0 ? spec.memory().device_budget() : machine.device_memory_bytes;
}

// The least any step needs of the device -- every chunk streamed, every
// gradient sent home between its uses, no activations at all -- within the
// device less the auto policy's margin: a job that cannot meet it would stop
// in its warm-up step, after the model was built and its chunks filled.
void CheckDeviceFits(Problems& p, const JobSpec& spec, const MachineFacts& machine, const RankChunks& chunks) {
  const uint64_t device = RankDeviceBytes(spec, machine);
  if (device == 0 || spec.memory().policy() == ferry::v1::MEMORY_POLICY_STATIC) return;
  const double margin = spec.memory().margin();
  if (!(margin >= 0 && margin <= 0.9)) return;  // refused as a field of its own
  const uint64_t limit = static_cast<uint64_t>(double(device) * (1.0 - margin));
  const PlanInput in = DevicePlanInput(chunks, spec, limit);
  const Plan least = PlanLeast(in);
  if (least.feasible) return;
  const int period = least.binding_period;
  const int stages = in.forward_periods;
  const int stage = period < stages ? period : 2 * stages - 1 - period;
  const std::string stage_name = StagesOf(chunks.config, chunks.tensor).Describe(stage);
  uint64_t largest_chunk = 0;
  for (uint64_t bytes : in.param_bytes) largest_chunk = std::max(largest_chunk, bytes);
  const uint64_t need = least.binding_need();
  const uint64_t at_least = static_cast<uint64_t>(double(need) / (1.0 - margin)) + 1;
  p.Precondition(absl::StrCat(
      "memory.device_budget: the step cannot fit the device's ", BytesText(device), " (", BytesText(limit),
      " with memory.margin kept free) even with every chunk streamed, gradients sent home between their uses, "
      "and before any activations: the ",
      period < stages ? "forward" : "backward", " of ", stage_name, " needs ", BytesText(need),
      " of its chunks' weights and of the gradients being accumulated then (the largest chunk holds ",
      BytesText(largest_chunk), " of weights; a tensor is never split across chunks); raise ",
      "memory.device_budget to well above ", BytesText(at_least),
      ", as activations come on top, or train a smaller model"));
}

void CheckMemory(Problems& p, const JobSpec& spec, const MachineFacts& machine, bool parallel_ok,
                 std::optional<uint64_t> disk_free) {
  const ferry::v1::MemorySpec& m = spec.memory();
  auto fraction = [&p](const char* field, double value, double high) {
    if (!(value >= 0.0 && value <= high)) {
      p.Invalid(absl::StrCat(field, ": ", value, " is out of range; use 0 to ", high));
    }
  };
  fraction("memory.static_param_host_fraction", m.static_param_host_fraction(), 1.0);
  fraction("memory.static_optimizer_host_fraction", m.static_optimizer_host_fraction(), 1.0);
  fraction("memory.margin", m.margin(), 0.9);
  // A job file says no more (ParseSize): a larger size could not be read
  // back from the spec a worker is handed.
  for (const auto& [field, bytes] : {std::pair<const char*, uint64_t>{"device_budget", m.device_budget()},
                                     {"host_budget", m.host_budget()},
                                     {"chunk_size", m.chunk_size()},
                                     {"disk_budget", m.disk_budget()}}) {
    if (bytes > kMaxSizeBytes) {
      p.Invalid(absl::StrCat("memory.", field, ": ", bytes, " bytes is beyond any machine; use at most 8 EiB "
                             "(2^63 bytes), or leave it unset"));
    }
  }
  if (m.chunk_size() > 0 && m.chunk_size() < 4096) {
    p.Invalid(absl::StrCat("memory.chunk_size: ", FormatSize(m.chunk_size()),
                           " is too small; use at least 4KiB, or leave it unset to let Ferry choose"));
  }
  if (m.recompute_every() > 1024) {
    p.Invalid(absl::StrCat("memory.recompute_every: ", m.recompute_every(), " is out of range; use 1 to 1024"));
  }
  if (m.device_budget() > 0 && m.device_budget() < (1u << 20)) {
    p.Invalid(absl::StrCat("memory.device_budget: ", FormatSize(m.device_budget()),
                           " is too small to train in; use at least 1MiB"));
  }
  if (machine.device_memory_bytes > 0 && m.device_budget() > machine.device_memory_bytes) {
    p.Precondition(absl::StrCat("memory.device_budget: ", FormatSize(m.device_budget()),
                                " is more than the device's memory (", FormatSize(machine.device_memory_bytes),
                                "); lower it, or leave it unset to use the whole device"));
  }
  if (machine.host_memory_bytes == 0) return;
  if (machine.device_is_host_memory && m.device_budget() > machine.host_memory_bytes) {
    p.Precondition(absl::StrCat("memory.device_budget: ", FormatSize(m.device_budget()),
                                " is more than this machine's memory (", FormatSize(machine.host_memory_bytes),
                                "), which the simulated device (there is no GPU) is part of; lower it, or "
                                "leave it unset for a quarter of host memory"));
    return;
  }
  const uint64_t ranks_here = RanksHere(spec, machine);
  const uint64_t replicas_here = machine.ranks_share_host ? std::max<uint32_t>(1, spec.parallel().data()) : 1;
  if (m.host_budget() > machine.host_memory_bytes) {
    p.Precondition(absl::StrCat("memory.host_budget: ", FormatSize(m.host_budget()),
                                " is more than this machine's memory (",
                                FormatSize(machine.host_memory_bytes), "); lower it"));
    return;
  }
  if (m.host_budget() > 0 && SaturatingMul(m.host_budget(), ranks_here) > machine.host_memory_bytes) {
    p.Precondition(absl::StrCat("memory.host_budget: ", FormatSize(m.host_budget()), " for each of the ", ranks_here,
                                " ranks on this machine (parallel.tensor x parallel.data) is ",
                                FormatSize(SaturatingMul(m.host_budget(), ranks_here)), ", more than its memory (",
                                FormatSize(machine.host_memory_bytes),
                                "); lower it, or use fewer ranks (parallel.data)"));
    return;
  }
  if (!parallel_ok) return;  // the rank's shapes need a valid split

  // Where each rank's chunks live: the tier plan the chunk manager makes
  // before its first step, from the same layout and limits. It keeps a
  // chunk's host side (parameters and gradients in host memory, optimizer
  // states in host memory or on disk) whatever the device later holds, so
  // device memory does not make room on the host.
  absl::StatusOr<RankChunks> chunks = LayRankChunks(spec);
  if (!chunks.ok()) {
    p.Invalid(absl::StrCat(m.chunk_size() > 0 ? "memory.chunk_size: " : "model: ", chunks.status().message()));
    return;
  }
  CheckDeviceFits(p, spec, machine, *chunks);
  TierInput input = TierPlanInput(*chunks, spec);
  input.host_limit_bytes = RankHostBudgetBytes(spec, machine);
  input.disk_dir = DiskTierBase(spec, machine);
  input.disk_limit_is_free_space = m.disk_budget() == 0 && disk_free.has_value();
  if (disk_free.has_value()) {
    input.disk_limit_bytes = RankDiskBudgetBytes(spec, machine, *disk_free);
  } else if (!DiskTierBase(spec, machine).empty()) {
    // The file system was not looked at: only a budget the spec sets bounds
    // the tier here.
    input.disk_limit_bytes = m.disk_budget() > 0 ? m.disk_budget() : UINT64_MAX;
  }
  const TierPlan plan = PlanTiers(input);
  if (!plan.feasible) {
    std::string what = plan.problem;
    if (m.host_budget() == 0) {
      absl::StrAppend(&what, "; memory.host_budget is unset, so each rank may use 3/4 of the ",
                      FormatSize(machine.host_memory_bytes), " of host memory");
      if (machine.device_is_host_memory) {
        absl::StrAppend(&what, " less the simulated device's ", FormatSize(SimulatedDeviceBytes(spec, machine)),
                        ranks_here > 1 ? " a rank" : "", " (the simulated device's memory is host memory too)");
      }
      if (ranks_here > 1) {
        absl::StrAppend(&what, ", split among ", ranks_here, " ranks on this machine");
        if (replicas_here > 1) absl::StrAppend(&what, " (x ", replicas_here, " data-parallel ranks on this machine)");
      }
    }
    if (replicas_here > 1) absl::StrAppend(&what, "; or use fewer data-parallel ranks (parallel.data)");
    p.Precondition(what);
    return;
  }
  if (disk_free.has_value() && plan.disk_bytes > 0 &&
      SaturatingMul(plan.disk_bytes, ranks_here) > *disk_free) {
    p.Precondition(absl::StrCat(
        "memory.disk_budget: the disk tier needs ", FormatSize(plan.disk_bytes),
        ranks_here > 1 ? absl::StrCat(" for each of ", ranks_here, " ranks") : std::string(),
        " for the gradients and optimizer states memory.host_budget cannot hold, but only ", FormatSize(*disk_free),
        " is free under ", DiskTierBase(spec, machine),
        "; free space there, choose another memory.disk_dir, or raise memory.host_budget"));
  }
}

// The disk tier's directory: confined like checkpoint.dir, and on a file
// system this process may write. Returns the free space of that file system
// when it was looked at.
std::optional<uint64_t> CheckDiskDir(Problems& p, const JobSpec& spec, const MachineFacts& machine) {
  const ferry::v1::MemorySpec& m = spec.memory();
  if (m.disk_budget() > 0 && m.disk_budget() < (1u << 20)) {
    p.Invalid(absl::StrCat("memory.disk_budget: ", FormatSize(m.disk_budget()),
                           " is too small for the disk tier; use at least 1MiB, or leave it unset for 9/10 of the "
                           "free space under memory.disk_dir (the tier holds only what memory.host_budget cannot)"));
  }
  const std::string& dir = m.disk_dir();
  if (!dir.empty() && !CheckPath(p, "memory.disk_dir", dir, PathKind::kDirectory, machine)) return std::nullopt;
  const std::string base = DiskTierBase(spec, machine);
  if (!machine.check_files || base.empty() || !machine.disk) return std::nullopt;
  absl::StatusOr<DiskFacts> facts = machine.disk(base);
  if (!facts.ok()) {
    if (!dir.empty()) p.Precondition(absl::StrCat("memory.disk_dir: ", facts.status().message()));
    return std::nullopt;
  }
  if (dir.empty()) return facts->free_bytes;
  if (facts->read_only) {
    p.Precondition(absl::StrCat("memory.disk_dir: ", dir, " is on a read-only file system (", facts->existing,
                                "); choose a directory on a writable one"));
    return std::nullopt;
  }
  if (!facts->writable) {
    p.Precondition(absl::StrCat("memory.disk_dir: ", dir, " cannot be written by the daemon (", facts->existing, ": ",
                                facts->not_writable_reason,
                                "); choose a directory it may write, or give its user write access"));
    return std::nullopt;
  }
  return facts->free_bytes;
}

// True when the model splits across the tensor-parallel ranks.
bool CheckParallel(Problems& p, const JobSpec& spec) {
  const ferry::v1::ParallelSpec& parallel = spec.parallel();
  p.Range<uint32_t>("parallel.tensor", parallel.tensor(), 1, 1024);
  p.Range<uint32_t>("parallel.data", parallel.data(), 1, 1024);
  if (parallel.tensor() < 1 || parallel.data() < 1 || parallel.tensor() > 1024 || parallel.data() > 1024) {
    return false;
  }
  const uint32_t t = parallel.tensor();
  const ferry::v1::ModelSpec& m = spec.model();
  // Megatron's split: whole heads and whole vocabulary rows per rank.
  if (t > 1 && m.heads() % t != 0) {
    p.Invalid(absl::StrCat("parallel.tensor: ", t, " ranks cannot split model.heads (", m.heads(),
                           "); use a divisor of the head count"));
  }
  if (t > 1 && m.vocab_size() % t != 0) {
    p.Invalid(absl::StrCat("parallel.tensor: ", t, " ranks cannot split model.vocab_size (", m.vocab_size(),
                           "); pad the vocabulary to a multiple of ", t));
  }
  bool splits = t == 1 || (m.heads() % t == 0 && m.vocab_size() % t == 0);
  // Grouped-query attention splits whole key/value heads, SwiGLU whole
  // columns: a tensor size that does not divide them is refused (rather
  // than repeating key/value heads on several ranks).
  if (splits && t > 1 && m.heads() > 0 && m.hidden() > 0) {
    if (absl::Status s = CheckModelConfig(ToModelConfig(m), static_cast<int>(t)); !s.ok()) {
      p.Invalid(std::string(s.message()));
      splits = false;
    }
  }
  if (parallel.data() > 1 && spec.train().batch_size() % parallel.data() != 0) {
    p.Invalid(absl::StrCat("train.batch_size: ", spec.train().batch_size(), " does not split across ",
                           parallel.data(), " data-parallel ranks; use a multiple of ", parallel.data()));
  } else if (parallel.data() > 1 && spec.train().grad_accum_steps() > 1 &&
             spec.train().batch_size() % (uint64_t{spec.train().grad_accum_steps()} * parallel.data()) != 0) {
    const uint64_t split = uint64_t{spec.train().grad_accum_steps()} * parallel.data();
    p.Invalid(absl::StrCat("train.batch_size: ", spec.train().batch_size(), " does not split into ",
                           spec.train().grad_accum_steps(), " micro-batches (train.grad_accum_steps) on each of ",
                           parallel.data(), " data-parallel ranks; use a multiple of ", split));
  }
  return splits;
}

void CheckCheckpoint(Problems& p, const ferry::v1::CheckpointSpec& c, const MachineFacts& machine) {
  if (c.dir().empty()) {
    if (c.every_steps() != 0 || c.keep() != 0 || c.on_error() != ferry::v1::CHECKPOINT_ON_ERROR_UNSPECIFIED) {
      p.Invalid("checkpoint.dir: set it to a directory, or remove every_steps, keep and on_error");
    }
    return;
  }
  CheckPath(p, "checkpoint.dir", c.dir(), PathKind::kDirectory, machine);
  p.Range<uint32_t>("checkpoint.keep", c.keep(), 1, 1000);
}

// Checks made by field type rather than by name, so that a field added to
// the spec is never left unchecked: enum values this build knows (proto3
// keeps any number a client sends, which the worker could not read back), and
// paths the checks above do not know (fields marked `(ferry.v1.path)` other
// than data.path, data.eval.path, checkpoint.dir and memory.disk_dir), confined like them
// whatever they name.
void CheckFieldsByType(Problems& p, const google::protobuf::Message& message, const std::string& prefix,
                       const MachineFacts& machine) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    const int count = f->is_repeated() ? reflection->FieldSize(message, f) : 1;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        for (int i = 0; i < count; ++i) {
          CheckFieldsByType(p,
                            f->is_repeated() ? reflection->GetRepeatedMessage(message, f, i)
                                             : reflection->GetMessage(message, f),
                            f->is_repeated() ? absl::StrCat(name, "[", i, "]") : name, machine);
        }
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        for (int i = 0; i < count; ++i) {
          const int value = f->is_repeated() ? reflection->GetRepeatedEnumValue(message, f, i)
                                             : reflection->GetEnumValue(message, f);
          if (f->enum_type()->FindValueByNumber(value) == nullptr) {
            p.Invalid(absl::StrCat(name, ": ", value, " is not a value this daemon knows; use one of ",
                                   EnumChoices(f->enum_type())));
          }
        }
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (!f->options().GetExtension(ferry::v1::path) || name == "data.path" || name == "data.eval.path" ||
            name == "checkpoint.dir" ||
            name == "memory.disk_dir") {
          break;
        }
        for (int i = 0; i < count; ++i) {
          const std::string& value =
              f->is_repeated() ? reflection->GetRepeatedString(message, f, i) : reflection->GetString(message, f);
          if (!value.empty()) CheckPath(p, name.c_str(), value, PathKind::kFile, machine);
        }
        break;
      default:
        break;
    }
  }
}

}  // namespace

uint64_t TrainingStateBytes(const ferry::v1::ModelSpec& model) {
  const int64_t params = ToModelConfig(model).ParameterCount();
  return params > 0 ? static_cast<uint64_t>(params) * 16 : 0;
}

absl::StatusOr<DiskFacts> ProbeDisk(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", dir, "' is not an absolute path"));
  }
  DiskFacts facts;
  facts.existing = NormalizePath(dir);
  struct stat st;
  while (stat(facts.existing.c_str(), &st) != 0) {
    if (errno != ENOENT || facts.existing == "/") {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot examine ", facts.existing, ": ", std::strerror(errno)));
    }
    const size_t slash = facts.existing.rfind('/');
    facts.existing = slash == 0 ? "/" : facts.existing.substr(0, slash);
  }
  struct statvfs vfs;
  if (statvfs(facts.existing.c_str(), &vfs) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot examine the file system of ", facts.existing, ": ", std::strerror(errno)));
  }
  facts.free_bytes = SaturatingMul(static_cast<uint64_t>(vfs.f_bavail), static_cast<uint64_t>(vfs.f_frsize));
  facts.read_only = (vfs.f_flag & ST_RDONLY) != 0;
  if (access(facts.existing.c_str(), W_OK) != 0) {
    facts.writable = false;
    facts.not_writable_reason = std::strerror(errno);
  }
  return facts;
}


absl::StatusOr<PlanInput> RankDevicePlanInput(const JobSpec& spec, uint64_t limit_bytes) {
  ASSIGN_OR_RETURN(RankChunks chunks, LayRankChunks(spec));
  return DevicePlanInput(chunks, spec, limit_bytes);
}

absl::StatusOr<TierInput> RankTierInput(const JobSpec& spec) {
  ASSIGN_OR_RETURN(RankChunks chunks, LayRankChunks(spec));
  return TierPlanInput(chunks, spec);
}

uint64_t RankHostBudgetBytes(const JobSpec& spec, const MachineFacts& machine) {
  if (spec.memory().host_budget() > 0) return spec.memory().host_budget();
  if (machine.host_memory_bytes == 0) return 0;
  const uint64_t ranks = RanksHere(spec, machine);
  const uint64_t whole =
      DefaultHostBudgetBytes(machine.host_memory_bytes, SaturatingMul(SimulatedDeviceBytes(spec, machine), ranks));
  // Never 0, which would mean no limit at all.
  return std::max<uint64_t>(whole / ranks, 1);
}

uint64_t RankDiskBudgetBytes(const JobSpec& spec, const MachineFacts& machine, uint64_t free_disk_bytes) {
  if (spec.memory().disk_budget() > 0) return spec.memory().disk_budget();
  return DefaultDiskBudgetBytes(free_disk_bytes) / RanksHere(spec, machine);
}

std::string DiskTierBase(const JobSpec& spec, const MachineFacts& machine) {
  return spec.memory().disk_dir().empty() ? machine.default_disk_dir : spec.memory().disk_dir();
}

namespace {

// The architecture is still to be read from model.init_from: a shape field
// unset, or a model folder's config.json not yet read.
bool Unresolved(const ferry::v1::ModelSpec& m) {
  return !m.init_from().empty() &&
         (m.layers() == 0 || m.hidden() == 0 || m.heads() == 0 || m.vocab_size() == 0 || m.seq_len() == 0 ||
          (!m.has_architecture() && ModelFiles::IsFolder(m.init_from())));
}

// model.init_from's index, the file confined and opened as the worker will.
absl::StatusOr<SafetensorsIndex> WeightsIndex(const std::string& path, const MachineFacts& machine) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("model.init_from: '", path,
                                                   "' must be an absolute path (the ferry CLI resolves relative "
                                                   "paths against the job file's directory)"));
  }
  RETURN_IF_ERROR(CheckConfined(machine.allowed_roots, "model.init_from", path, PathKind::kFile).status());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  if (absl::IsNotFound(reader.status())) {
    return absl::FailedPreconditionError(absl::StrCat("model.init_from: ", path,
                                                      " does not exist on the daemon's machine"));
  }
  if (!reader.ok()) return reader.status();
  return reader->index();
}

// A model folder's config.json, confined and read as the worker will.
absl::StatusOr<HfConfig> FolderConfig(const std::string& dir, const MachineFacts& machine) {
  const std::string base = dir.back() == '/' ? dir : dir + "/";
  for (const char* file : {"config.json", "generation_config.json"}) {
    absl::StatusOr<ResolvedPath> confined =
        CheckConfined(machine.allowed_roots, "model.init_from", base + file, PathKind::kFile);
    // A missing file is the reader's to say.
    if (!confined.ok() && !absl::IsNotFound(confined.status())) return confined.status();
  }
  return ReadHfFolderConfig(dir);
}

// Every file of a model folder, or the one file, holds exactly the model's
// weights; every shard confined.
absl::Status CheckWeights(const JobSpec& spec, const MachineFacts& machine) {
  const std::string& path = spec.model().init_from();
  const ModelConfig config = ToModelConfig(spec.model());
  if (!ModelFiles::IsFolder(path) && config.model_type == "gpt2") {
    ASSIGN_OR_RETURN(SafetensorsIndex index, WeightsIndex(path, machine));
    return CheckGpt2Weights(index, config, path);
  }
  if (ModelFiles::IsFolder(path)) {
    RETURN_IF_ERROR(CheckConfined(machine.allowed_roots, "model.init_from", path, PathKind::kDirectory).status());
    ASSIGN_OR_RETURN(HfConfig folder, FolderConfig(path, machine));
    RETURN_IF_ERROR(CheckSlidingWindow(folder, config.seq_len));
  } else {
    RETURN_IF_ERROR(CheckConfined(machine.allowed_roots, "model.init_from", path, PathKind::kFile).status());
  }
  ASSIGN_OR_RETURN(ModelFiles files, ModelFiles::Open(path, [&](const std::string& file) {
                     return CheckConfined(machine.allowed_roots, "model.init_from", file, PathKind::kFile).status();
                   }));
  auto find = [&](const std::string& name) {
    const SafetensorsEntry* e = files.Find(name);
    return e != nullptr ? e : files.Find("transformer." + name);
  };
  return CheckHfWeights(config, find, files.All(), files.what());
}

}  // namespace

absl::Status ResolveModelFromWeights(JobSpec* spec, const MachineFacts& machine) {
  ferry::v1::ModelSpec* m = spec->mutable_model();
  if (!Unresolved(*m) || !machine.check_files) return absl::OkStatus();
  if (ModelFiles::IsFolder(m->init_from())) {
    RETURN_IF_ERROR(
        CheckConfined(machine.allowed_roots, "model.init_from", m->init_from(), PathKind::kDirectory).status());
    ASSIGN_OR_RETURN(HfConfig folder, FolderConfig(m->init_from(), machine));
    SetModelArchitecture(folder.model, m);
    // Recorded even for GPT-2, as read from the folder.
    if (!m->has_architecture()) m->mutable_architecture()->set_model_type(folder.model.model_type);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(SafetensorsIndex index, WeightsIndex(m->init_from(), machine));
  ASSIGN_OR_RETURN(ModelConfig c, Gpt2ConfigFromWeights(index, m->init_from(), m->heads()));
  auto fill = [](uint32_t value, int64_t from_file) {
    return value != 0 ? value : static_cast<uint32_t>(std::min<int64_t>(from_file, UINT32_MAX));
  };
  m->set_layers(fill(m->layers(), c.layers));
  m->set_hidden(fill(m->hidden(), c.hidden));
  m->set_heads(fill(m->heads(), c.heads));
  m->set_vocab_size(fill(m->vocab_size(), c.vocab_size));
  m->set_seq_len(fill(m->seq_len(), c.seq_len));
  return absl::OkStatus();
}

absl::Status ValidateSpec(const JobSpec& spec, const MachineFacts& machine) {
  Problems p;
  if (spec.name().size() > kMaxNameLength) {
    p.Invalid(absl::StrCat("name: ", spec.name().size(), " characters; use at most ",
                           kMaxNameLength));
  } else if (std::any_of(spec.name().begin(), spec.name().end(),
                         [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    p.Invalid("name: contains a control character (a newline, a tab, NUL...); use printable text");
  }
  // Without the file system (the CLI's own checks) a model still to be read
  // from its weights is left to the daemon.
  const bool model_ok = Unresolved(spec.model()) ? false : CheckModel(p, spec.model());
  if (Unresolved(spec.model()) && machine.check_files) {
    p.Invalid("model: the architecture was not read from model.init_from; submit through ferryd");
  } else if (model_ok && !spec.model().init_from().empty() && machine.check_files) {
    p.Add(CheckWeights(spec, machine));
  }
  CheckData(p, spec, machine);
  CheckTrain(p, spec.train());
  const bool parallel_ok = CheckParallel(p, spec);
  const std::optional<uint64_t> disk_free = CheckDiskDir(p, spec, machine);
  // Memory figures only mean something for a well-formed model.
  if (model_ok) CheckMemory(p, spec, machine, parallel_ok, disk_free);
  p.Range<uint32_t>("max_restarts", spec.max_restarts(), 0, 100);
  CheckCheckpoint(p, spec.checkpoint(), machine);
  CheckFieldsByType(p, spec, "", machine);
  return p.ToStatus();
}

}  // namespace ferry
