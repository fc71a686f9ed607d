#include "server/spec/spec_validator.h"

#include <sys/stat.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/spec/size.h"
#include "server/spec/spec_defaults.h"

namespace ferry {
namespace {

using ferry::v1::JobSpec;

constexpr uint32_t kMaxNameLength = 128;
constexpr uint32_t kMaxPathLength = 4096;

// Problems found, each with the code it calls for.
class Problems {
 public:
  void Invalid(std::string message) { invalid_.push_back(std::move(message)); }
  void Precondition(std::string message) { precondition_.push_back(std::move(message)); }
  void Unimplemented(std::string message) { unimplemented_.push_back(std::move(message)); }

  template <typename T>
  void Range(const char* field, T value, T low, T high, absl::string_view hint = "") {
    if (value < low || value > high) {
      Invalid(absl::StrCat(field, ": ", value, " is out of range; use ", low, " to ", high,
                           hint.empty() ? "" : " ", hint));
    }
  }

  bool empty() const {
    return invalid_.empty() && precondition_.empty() && unimplemented_.empty();
  }

  void Append(const Problems& other) {
    invalid_.insert(invalid_.end(), other.invalid_.begin(), other.invalid_.end());
    precondition_.insert(precondition_.end(), other.precondition_.begin(), other.precondition_.end());
    unimplemented_.insert(unimplemented_.end(), other.unimplemented_.begin(),
                          other.unimplemented_.end());
  }

  absl::Status ToStatus() const {
    std::vector<std::string> all = invalid_;
    all.insert(all.end(), precondition_.begin(), precondition_.end());
    all.insert(all.end(), unimplemented_.begin(), unimplemented_.end());
    if (all.empty()) return absl::OkStatus();
    const std::string message = absl::StrJoin(all, "; ");
    if (!invalid_.empty()) return absl::InvalidArgumentError(message);
    if (!precondition_.empty()) return absl::FailedPreconditionError(message);
    return absl::UnimplementedError(message);
  }

 private:
  std::vector<std::string> invalid_;
  std::vector<std::string> precondition_;
  std::vector<std::string> unimplemented_;
};

void CheckPath(Problems& p, const char* field, const std::string& path) {
  if (path.size() > kMaxPathLength) {
    p.Invalid(absl::StrCat(field, ": longer than ", kMaxPathLength, " characters"));
  } else if (path[0] != '/') {
    p.Invalid(absl::StrCat(field, ": '", path,
                           "' must be an absolute path (the ferry CLI resolves relative paths "
                           "against the job file's directory)"));
  }
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
  const bool ok = local.empty();
  p.Append(local);
  return ok;
}

void CheckData(Problems& p, const JobSpec& spec, const MachineFacts& machine) {
  const ferry::v1::DataSpec& data = spec.data();
  const uint64_t window = uint64_t{spec.model().seq_len()} + 1;
  switch (data.source_case()) {
    case ferry::v1::DataSpec::SOURCE_NOT_SET:
      p.Invalid("data: set path (a token file from `ferry data prepare`) or synthetic: {}");
      return;
    case ferry::v1::DataSpec::kSynthetic: {
      const uint32_t branching = data.synthetic().branching();
      if (branching < 1 || branching >= spec.model().vocab_size()) {
        p.Invalid(absl::StrCat("data.synthetic.branching: ", branching,
                               " must be at least 1 and below model.vocab_size (",
                               spec.model().vocab_size(), ")"));
      }
      return;
    }
    case ferry::v1::DataSpec::kPath:
      break;
  }
  const std::string& path = data.path();
  if (path.empty()) {
    p.Invalid("data.path: is empty; give a token file written by `ferry data prepare`");
    return;
  }
  CheckPath(p, "data.path", path);
  if (spec.model().vocab_size() > 65536) {
    p.Invalid(absl::StrCat("model.vocab_size: ", spec.model().vocab_size(),
                           " does not fit token files of uint16 tokens; use at most 65536"));
  }
  if (!machine.check_files || path[0] != '/') return;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    p.Precondition(absl::StrCat("data.path: ", path,
                                " does not exist on the daemon's machine; create it with "
                                "`ferry data prepare TEXT_FILES -o ", path, "`"));
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    p.Precondition(absl::StrCat("data.path: ", path, " is not a regular file"));
    return;
  }
  if (st.st_size % 2 != 0) {
    p.Precondition(absl::StrCat("data.path: ", path, " has an odd size (", st.st_size,
                                " bytes), so it is not a file of uint16 tokens; write it with "
                                "`ferry data prepare`"));
  } else if (static_cast<uint64_t>(st.st_size) / 2 < window) {
    p.Precondition(absl::StrCat("data.path: ", path, " holds ", st.st_size / 2,
                                " tokens, fewer than one window of model.seq_len + 1 = ", window,
                                "; use more data or a shorter seq_len"));
  }
}

void CheckTrain(Problems& p, const ferry::v1::TrainSpec& t) {
  p.Range<uint64_t>("train.steps", t.steps(), 1, 1000000000);
  p.Range<uint32_t>("train.batch_size", t.batch_size(), 1, 65536);
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
  if (!(t.grad_clip() >= 0)) {
    p.Invalid(absl::StrCat("train.grad_clip: ", t.grad_clip(), " must be 0 (off) or positive"));
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

void CheckMemory(Problems& p, const JobSpec& spec, const MachineFacts& machine) {
  const ferry::v1::MemorySpec& m = spec.memory();
  auto fraction = [&p](const char* field, double value, double high) {
    if (!(value >= 0.0 && value <= high)) {
      p.Invalid(absl::StrCat(field, ": ", value, " is out of range; use 0 to ", high));
    }
  };
  fraction("memory.static_param_host_fraction", m.static_param_host_fraction(), 1.0);
  fraction("memory.static_optimizer_host_fraction", m.static_optimizer_host_fraction(), 1.0);
  fraction("memory.margin", m.margin(), 0.9);
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
  if (machine.host_memory_bytes == 0) return;
  if (m.host_budget() > machine.host_memory_bytes) {
    p.Precondition(absl::StrCat("memory.host_budget: ", FormatSize(m.host_budget()),
                                " is more than this machine's memory (",
                                FormatSize(machine.host_memory_bytes), "); lower it"));
  }
  // Model data (16 bytes a parameter in fp32 and in mixed precision) lives
  // on the host, the device, or both.
  const uint64_t needed = TrainingStateBytes(spec.model());
  const uint64_t host = m.host_budget() > 0 ? std::min(m.host_budget(), machine.host_memory_bytes)
                                            : machine.host_memory_bytes;
  const uint64_t available = host + m.device_budget();
  if (needed > available) {
    p.Precondition(absl::StrCat(
        "model: ", ToGptConfig(spec.model()).ParameterCount(), " parameters need ",
        FormatSize(needed), " for weights, gradients and AdamW state, more than the ",
        FormatSize(available), " of ", m.host_budget() > 0 ? "memory.host_budget" : "host memory",
        m.device_budget() > 0 ? " and memory.device_budget" : "", "; choose a smaller model"));
  }
}

void CheckParallel(Problems& p, const JobSpec& spec) {
  const ferry::v1::ParallelSpec& parallel = spec.parallel();
  p.Range<uint32_t>("parallel.tensor", parallel.tensor(), 1, 1024);
  p.Range<uint32_t>("parallel.data", parallel.data(), 1, 1024);
  if (parallel.tensor() > 1024 || parallel.data() > 1024) return;
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
  if (parallel.data() > 1 && spec.train().batch_size() % parallel.data() != 0) {
    p.Invalid(absl::StrCat("train.batch_size: ", spec.train().batch_size(), " does not split across ",
                           parallel.data(), " data-parallel ranks; use a multiple of ", parallel.data()));
  }
}

void CheckCheckpoint(Problems& p, const ferry::v1::CheckpointSpec& c) {
  if (c.dir().empty()) {
    if (c.every_steps() != 0 || c.keep() != 0 || c.on_error() != ferry::v1::CHECKPOINT_ON_ERROR_UNSPECIFIED) {
      p.Invalid("checkpoint.dir: set it to a directory, or remove every_steps, keep and on_error");
    }
    return;
  }
  CheckPath(p, "checkpoint.dir", c.dir());
  p.Range<uint32_t>("checkpoint.keep", c.keep(), 1, 1000);
}

}  // namespace

uint64_t TrainingStateBytes(const ferry::v1::ModelSpec& model) {
  const int64_t params = ToGptConfig(model).ParameterCount();
  return params > 0 ? static_cast<uint64_t>(params) * 16 : 0;
}

absl::Status ValidateSpec(const JobSpec& spec, const MachineFacts& machine) {
  Problems p;
  if (spec.name().size() > kMaxNameLength) {
    p.Invalid(absl::StrCat("name: ", spec.name().size(), " characters; use at most ",
                           kMaxNameLength));
  }
  const bool model_ok = CheckModel(p, spec.model());
  CheckData(p, spec, machine);
  CheckTrain(p, spec.train());
  // Memory figures only mean something for a well-formed model.
  if (model_ok) CheckMemory(p, spec, machine);
  CheckParallel(p, spec);
  p.Range<uint32_t>("max_restarts", spec.max_restarts(), 0, 100);
  CheckCheckpoint(p, spec.checkpoint());
  return p.ToStatus();
}

}  // namespace ferry
