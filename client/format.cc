#include "client/format.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "server/common/enum_names.h"
#include "server/common/proto_time.h"
#include "server/spec/size.h"
#include "server/spec/yaml_to_proto.h"

namespace ferry {

std::string ShortState(ferry::v1::JobState state) { return StateName(state); }

std::string FormatClock(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string FormatCount(double value) {
  if (value >= 1e9) return absl::StrFormat("%.1fG", value / 1e9);
  if (value >= 1e6) return absl::StrFormat("%.1fM", value / 1e6);
  if (value >= 1e3) return absl::StrFormat("%.1fk", value / 1e3);
  return absl::StrFormat("%.0f", value);
}

std::string ProgressLine(const ferry::v1::Progress& p) {
  std::string line = absl::StrFormat("step %d/%d  loss %.4f  %s tok/s  %.3f s/step", p.step(),
                                     p.total_steps(), p.loss(), FormatCount(p.tokens_per_second()),
                                     p.step_seconds());
  if (p.has_eval()) absl::StrAppendFormat(&line, "  eval %.4f (ppl %.2f)", p.eval().loss(), p.eval().perplexity());
  if (p.loss_scale() > 1) absl::StrAppend(&line, "  scale ", FormatCount(p.loss_scale()));
  if (p.skipped_steps() > 0) absl::StrAppend(&line, "  skipped ", p.skipped_steps());
  if (p.step() > 0 && p.total_steps() > p.step()) {
    const double per_step = p.elapsed_seconds() / double(p.step());
    absl::StrAppend(&line, "  ETA ", FormatClock(per_step * double(p.total_steps() - p.step())));
  }
  return line;
}

namespace {

std::string Age(const google::protobuf::Timestamp& t, absl::Time now) {
  if (t.seconds() == 0) return "-";
  const double seconds = absl::ToDoubleSeconds(now - FromProtoTime(t));
  if (seconds < 60) return absl::StrFormat("%ds", static_cast<int>(seconds));
  if (seconds < 3600) return absl::StrFormat("%dm", static_cast<int>(seconds / 60));
  if (seconds < 86400) return absl::StrFormat("%dh", static_cast<int>(seconds / 3600));
  return absl::StrFormat("%dd", static_cast<int>(seconds / 86400));
}

// "0-3, 7, 9-10".
std::string BlockList(const google::protobuf::RepeatedField<uint32_t>& blocks) {
  std::vector<std::string> parts;
  for (int i = 0; i < blocks.size();) {
    int j = i;
    while (j + 1 < blocks.size() && blocks[j + 1] == blocks[j] + 1) ++j;
    parts.push_back(j > i ? absl::StrCat(blocks[i], "-", blocks[j]) : absl::StrCat(blocks[i]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

std::string ShortEnum(ferry::v1::RecomputeMode mode) {
  return ShortEnumName(ferry::v1::RecomputeMode_descriptor()->FindValueByNumber(mode));
}

std::string TimeText(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", FromProtoTime(t), absl::LocalTimeZone());
}

// "2.3456 (perplexity 10.44) at step 200, 3.1000 (22.20) before training".
std::string EvalText(const ferry::v1::Job& job) {
  const ferry::v1::Eval& e = job.last_eval();
  std::string text = absl::StrFormat("%.4f (perplexity %.2f) at step %d", e.loss(), e.perplexity(), e.step());
  if (job.has_initial_eval() && e.step() > 0) {
    absl::StrAppendFormat(&text, ", %.4f (%.2f) before training", job.initial_eval().loss(),
                          job.initial_eval().perplexity());
  }
  return text;
}

}  // namespace

std::string JobTable(const std::vector<ferry::v1::Job>& jobs, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {{"ID", "NAME", "STATE", "STEP", "LOSS", "AGE"}};
  for (const ferry::v1::Job& job : jobs) {
    const ferry::v1::Progress& p = job.progress();
    rows.push_back({job.id(), job.spec().name().empty() ? "-" : job.spec().name(),
                    ShortState(job.state()) + (job.cancel_requested() ? " (stopping)" : ""),
                    absl::StrCat(p.step(), "/", p.total_steps()),
                    p.step() > 0 ? absl::StrFormat("%.4f", p.loss()) : "-",
                    Age(job.create_time(), now)});
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string JobDetails(const ferry::v1::Job& job, absl::Time now) {
  (void)now;
  const ferry::v1::JobSpec& spec = job.spec();
  const ferry::v1::ModelSpec& m = spec.model();
  const ferry::v1::Progress& p = job.progress();
  std::string out;
  auto field = [&out](absl::string_view name, absl::string_view value) {
    absl::StrAppendFormat(&out, "%-12s %s\n", absl::StrCat(name, ":"), value);
  };
  field("id", job.id());
  field("name", spec.name().empty() ? "-" : spec.name());
  field("state", ShortState(job.state()) + (job.cancel_requested() ? " (stop requested)" : ""));
  if (!job.error().empty()) field("error", job.error());
  field("model", absl::StrFormat("%s%d layers, hidden %d, %d heads, vocab %d, context %d",
                                 m.preset().empty() ? "" : m.preset() + ": ", m.layers(), m.hidden(),
                                 m.heads(), m.vocab_size(), m.seq_len()));
  field("data", spec.data().has_synthetic()
                    ? absl::StrFormat("synthetic (branching %d)", spec.data().synthetic().branching())
                    : spec.data().path());
  field("train", absl::StrFormat("%d steps, batch %d%s, lr %g, seed %d", spec.train().steps(),
                                 spec.train().batch_size(),
                                 spec.train().grad_accum_steps() > 1
                                     ? absl::StrFormat(" (%d micro-batches)", spec.train().grad_accum_steps())
                                     : "",
                                 spec.train().lr(), spec.train().seed()));
  if (!job.device().empty()) field("device", job.device());
  field("created", TimeText(job.create_time()));
  field("started", TimeText(job.start_time()));
  field("ended", TimeText(job.end_time()));
  if (job.attempts() > 1) {
    field("runs", absl::StrCat(job.attempts(), job.interrupted_runs() > 0
                                                   ? absl::StrCat(" (", job.interrupted_runs(),
                                                                  " cut short by the daemon stopping)")
                                                   : ""));
  }
  if (job.has_last_checkpoint()) {
    const ferry::v1::CheckpointInfo& c = job.last_checkpoint();
    field("checkpoint", absl::StrFormat("step %d, %s, %s (%.2f s, training blocked %.2f s)", c.step(), c.path(),
                                        FormatSize(c.bytes()), c.total_seconds(), c.blocking_seconds()));
  }
  if (p.step() > 0) {
    field("progress", ProgressLine(p));
    field("loss", job.has_initial_loss()
                      ? absl::StrFormat("%.4f at step 1, %.4f at step %d", job.initial_loss(),
                                        p.loss(), p.step())
                      : absl::StrFormat("%.4f", p.loss()));
    if (job.has_last_eval()) field("eval", EvalText(job));
    if (p.recomputed_blocks_size() > 0) {
      field("recompute", absl::StrCat(BlockList(p.recomputed_blocks()), " of ", m.layers(), " blocks (",
                                      ShortEnum(spec.memory().recompute()), ")"));
    }
    std::vector<std::string> memory;
    for (const ferry::v1::MemoryUsage& u : p.memory()) {
      if (u.bytes() > 0) memory.push_back(absl::StrCat(u.tier(), " ", u.kind(), " ", FormatSize(u.bytes())));
    }
    if (!memory.empty()) field("memory", absl::StrJoin(memory, ", "));
    if (p.disk_chunks() > 0 || p.disk_model_bytes() > 0) {
      field("disk", absl::StrFormat("%s of gradients and optimizer states of %d chunks in %s; last step %s read, %s written, "
                                    "%.2f s waiting",
                                    FormatSize(p.disk_model_bytes()), p.disk_chunks(),
                                    spec.memory().disk_dir().empty() ? "the job's directory" : spec.memory().disk_dir(),
                                    FormatSize(p.bytes_disk_to_host()), FormatSize(p.bytes_host_to_disk()),
                                    p.step_times().disk_seconds()));
    }
  }
  return out;
}

namespace {

std::string FormatFlops(double flops) {
  if (flops >= 1e12) return absl::StrFormat("%.2f TFLOP/s", flops / 1e12);
  return absl::StrFormat("%.1f GFLOP/s", flops / 1e9);
}

}  // namespace

std::string DaemonInfoText(const ferry::v1::DaemonInfo& info) {
  std::string out = absl::StrFormat("ferryd %s (LibTorch %s), %d CPUs, %s host memory\n",
                                    info.version(), info.torch_version(), info.host_cpus(),
                                    FormatSize(info.host_memory_bytes()));
  absl::StrAppend(&out, "state:   ", info.state_dir(), "\n");
  if (info.allowed_roots_size() > 0) {
    absl::StrAppend(&out, "paths:   job spec paths must be inside ", absl::StrJoin(info.allowed_roots(), ", "), "\n");
  }
  for (const ferry::v1::Device& d : info.devices()) {
    absl::StrAppendFormat(&out, "device:  %s (%s), %s", d.name(), d.description(), FormatSize(d.memory_bytes()));
    if (d.fp32_matmul_flops() > 0) {
      absl::StrAppend(&out, "; matrix products ", FormatFlops(d.fp32_matmul_flops()), " fp32, ",
                      FormatFlops(d.bf16_matmul_flops()), " bf16");
    }
    out += "\n";
  }
  const ferry::v1::Limits& l = info.limits();
  absl::StrAppendFormat(&out, "limits:  %d queued jobs, %d watchers per job, %d buffered events, %s messages\n",
                        l.max_queued_jobs(), l.max_watchers_per_job(), l.event_buffer_events(),
                        FormatSize(l.max_message_bytes()));
  return out;
}

namespace {

std::string Bar(uint64_t used, uint64_t total, int width) {
  const int filled = total > 0 ? static_cast<int>(std::min<double>(width, double(width) * double(used) / double(total) + 0.5)) : 0;
  return "[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '.') + "]";
}

// Where a payload's values are, one letter: D device, H host, S the disk
// tier (storage), B both device and host, - none.
char TierMark(const std::string& tier) {
  if (tier == "device") return 'D';
  if (tier == "host") return 'H';
  if (tier == "disk") return 'S';
  if (tier == "both") return 'B';
  return '-';
}

int TierIndex(const std::string& tier) { return tier == "device" ? 0 : tier == "host" ? 1 : tier == "disk" ? 2 : -1; }

}  // namespace

std::string MemoryPlacementText(const ferry::v1::MemoryPlacement& m) {
  std::string out = absl::StrFormat("%s%s  %s policy on %s, %s (step %d)\n", m.job_id(),
                                    m.world_size() > 1 ? absl::StrFormat(" rank %d of %d", m.rank(), m.world_size()) : "",
                                    m.policy(), m.device(), m.phase(), m.step());
  uint64_t tier_bytes[3] = {0, 0, 0};
  std::string kinds[3];
  for (const ferry::v1::MemoryUsage& u : m.totals()) {
    const int t = TierIndex(u.tier());
    if (t < 0) continue;
    tier_bytes[t] += u.bytes();
    absl::StrAppend(&kinds[t], "  ", u.kind(), " ", FormatSize(u.bytes()));
  }
  absl::StrAppendFormat(&out, "device %s  %s of %s (the plan fills up to %s)\n       %s\n",
                        Bar(tier_bytes[0], m.device_capacity_bytes(), 40), FormatSize(tier_bytes[0]),
                        FormatSize(m.device_capacity_bytes()), FormatSize(m.device_limit_bytes()), kinds[0]);
  const uint64_t host_total = m.host_budget_bytes() > 0 ? m.host_budget_bytes() : 0;
  absl::StrAppendFormat(&out, "host   %s  %s%s%s\n       %s\n", Bar(tier_bytes[1], host_total, 40),
                        FormatSize(tier_bytes[1]),
                        host_total > 0 ? " of " + FormatSize(host_total) + " (memory.host_budget)" : " (no budget)",
                        m.planned_host_bytes() > 0 ? "; planned peak " + FormatSize(m.planned_host_bytes()) : "",
                        kinds[1]);
  // The disk tier, where the job has one.
  const bool disk = !m.disk_dir().empty() || tier_bytes[2] > 0;
  if (disk) {
    absl::StrAppendFormat(&out, "disk   %s  %s of %s (memory.disk_budget) in %s\n       %s\n",
                          Bar(tier_bytes[2], m.disk_budget_bytes(), 40), FormatSize(tier_bytes[2]),
                          FormatSize(m.disk_budget_bytes()), m.disk_dir().empty() ? "-" : m.disk_dir(),
                          kinds[2].empty() ? "  nothing: the model data fits host memory" : kinds[2]);
  }
  const int chunk_count = m.chunks_size() / 3;
  if (m.recomputed_blocks_size() > 0) {
    absl::StrAppend(&out, "recomputing blocks ", BlockList(m.recomputed_blocks()), "\n");
  }
  absl::StrAppendFormat(&out, "%d chunks of %s (%.1f%% unused); planned traffic %s per steady step", chunk_count,
                        FormatSize(m.chunk_size_bytes()), 100.0 * m.chunk_waste_fraction(),
                        FormatSize(m.planned_traffic_bytes()));
  if (m.planned_disk_bytes() > 0) {
    absl::StrAppendFormat(&out, ", and %s read from disk and %s written", FormatSize(m.planned_disk_read_bytes()),
                          FormatSize(m.planned_disk_write_bytes()));
  }
  out += "\n";
  absl::StrAppend(&out, "chunk map (P params, G grads, O optimizer; D device, H host, ",
                  disk ? "S disk, " : "", "B both, - none):\n");
  for (int c = 0; c + 2 < m.chunks_size(); c += 3) {
    const ferry::v1::ChunkPlacement& p = m.chunks(c);
    const ferry::v1::ChunkPlacement& o = m.chunks(c + 2);
    // A disk-homed state cached elsewhere (on the device) still says so.
    const bool homed_on_disk = o.home() == "disk" && o.tier() != "disk";
    absl::StrAppendFormat(&out, "  %3d  P%c G%c O%c  %-13s %-16s %d tensors%s\n", p.chunk(), TierMark(p.tier()),
                          TierMark(m.chunks(c + 1).tier()), TierMark(o.tier()), p.placement(), p.state(),
                          p.tensors(), homed_on_disk ? "; O's home on disk" : "");
  }
  uint64_t largest = 1;
  for (const ferry::v1::PeriodTrace& t : m.trace()) largest = std::max<uint64_t>(largest, t.non_model_bytes());
  absl::StrAppend(&out, "warm-up trace (non-model memory per period):\n");
  for (const ferry::v1::PeriodTrace& t : m.trace()) {
    absl::StrAppendFormat(&out, "  %-18s %10s  %s\n", t.name(), FormatSize(t.non_model_bytes()),
                          std::string(static_cast<size_t>(30.0 * double(t.non_model_bytes()) / double(largest) + 0.5), '#'));
  }
  return out;
}

namespace {

void BlockStyle(YAML::Node node) {
  if (node.IsMap() || node.IsSequence()) {
    node.SetStyle(YAML::EmitterStyle::Block);
    for (auto it = node.begin(); it != node.end(); ++it) BlockStyle(node.IsMap() ? it->second : *it);
  }
}

// A bar of `width` cells: `parts` filled in turn with their characters, the
// rest with '.'; each part's cells rounded, never past the end.
std::string Bar(const std::vector<std::pair<double, char>>& parts, double whole, int width) {
  std::string bar;
  double done = 0;
  for (const auto& [amount, c] : parts) {
    done += amount;
    const int upto = whole > 0 ? static_cast<int>(std::min(1.0, done / whole) * width + 0.5) : 0;
    while (static_cast<int>(bar.size()) < upto) bar += c;
  }
  bar.resize(static_cast<size_t>(width), '.');
  return "[" + bar + "]";
}

std::string Percent(double part, double whole) {
  return whole > 0 ? absl::StrFormat("%.0f%%", 100.0 * part / whole) : "-";
}

}  // namespace

std::string JsonToYaml(const std::string& json) {
  try {
    YAML::Node node = YAML::Load(json);
    BlockStyle(node);
    YAML::Emitter out;
    out << node;
    return std::string(out.c_str()) + "\n";
  } catch (const std::exception&) {
    return json;
  }
}

namespace {

// The matrix-product rate a job of `precision` can reach on `device`: bf16
// products where the job is in reduced precision and the device multiplies
// bf16 faster than fp32 (a CPU without bf16 arithmetic computes them in
// fp32), fp32 otherwise.
double MatmulRateFor(const ferry::v1::Device& device, ferry::v1::Precision precision) {
  const bool reduced = precision == ferry::v1::PRECISION_BF16 || precision == ferry::v1::PRECISION_FP16;
  return reduced ? std::max(device.bf16_matmul_flops(), device.fp32_matmul_flops()) : device.fp32_matmul_flops();
}

}  // namespace

std::string TopFrame(const ferry::v1::Job& job, const ferry::v1::MemoryPlacement* placement, int width,
                     const ferry::v1::DaemonInfo* info) {
  const ferry::v1::Progress& p = job.progress();
  const int bar = std::max(10, std::min(60, width - 50));
  std::string out = absl::StrFormat("%s%s  %s", job.id(), job.spec().name().empty() ? "" : " (" + job.spec().name() + ")",
                                    absl::AsciiStrToUpper(ShortState(job.state())));
  if (p.total_steps() > 0) {
    absl::StrAppendFormat(&out, "  step %d/%d (%s)", p.step(), p.total_steps(),
                          Percent(static_cast<double>(p.step()), static_cast<double>(p.total_steps())));
    if (p.step() > 0 && p.step() < p.total_steps() && p.elapsed_seconds() > 0) {
      const double eta = p.elapsed_seconds() / static_cast<double>(p.step()) * static_cast<double>(p.total_steps() - p.step());
      absl::StrAppend(&out, "  ETA ", absl::FormatDuration(absl::Seconds(static_cast<int64_t>(eta))));
    }
  }
  out += "\n";
  if (p.step() == 0) return out + "waiting for the first step\n";
  absl::StrAppendFormat(&out, "loss %.4f%s  lr %.3g  grad norm %.3g  %.0f tok/s  %.3f s/step\n", p.loss(),
                        job.has_initial_loss() ? absl::StrFormat(" (first %.4f)", job.initial_loss()) : "", p.lr(),
                        p.grad_norm(), p.tokens_per_second(), p.step_seconds());
  if (job.has_last_eval()) absl::StrAppend(&out, "eval loss ", EvalText(job), "\n");
  if (p.achieved_flops() > 0) {
    absl::StrAppend(&out, "compute ", FormatFlops(p.achieved_flops()), " (6 x parameters x tokens a second)");
    double rate = 0;
    if (info != nullptr && info->devices_size() > 0) {
      rate = MatmulRateFor(info->devices(0), job.spec().train().precision());
    }
    if (rate > 0) {
      absl::StrAppend(&out, ", ", Percent(p.achieved_flops(), rate), " of the device's ", FormatFlops(rate),
                      " matrix-product rate");
    }
    out += "\n";
  }

  // Memory per tier.
  uint64_t device_capacity = 0, host_capacity = 0, disk_capacity = 0;
  for (const ferry::v1::MemoryUsage& c : p.capacity()) {
    if (c.tier() == "device") device_capacity = c.bytes();
    if (c.tier() == "host") host_capacity = c.bytes();
    if (c.tier() == "disk") disk_capacity = c.bytes();
  }
  uint64_t device_model = 0, device_other = 0, host_model = 0, disk_model = 0;
  for (const ferry::v1::MemoryUsage& u : p.memory()) {
    if (u.tier() == "device") (u.kind() == "activation" ? device_other : device_model) += u.bytes();
    if (u.tier() == "host") host_model += u.bytes();
    if (u.tier() == "disk") disk_model += u.bytes();
  }
  const bool disk = disk_capacity > 0 || disk_model > 0 || p.disk_chunks() > 0;
  out += "memory  (# model data, + activations and workspace at the step's peak)\n";
  absl::StrAppendFormat(&out, "  device %s  %s model + %s of %s", Bar({{double(device_model), '#'}, {double(device_other), '+'}},
                                                                    double(device_capacity), bar),
                        FormatSize(device_model), FormatSize(device_other), FormatSize(device_capacity));
  if (placement != nullptr && placement->device_limit_bytes() > 0) {
    absl::StrAppend(&out, " (plan fills ", FormatSize(placement->device_limit_bytes()), ")");
  }
  absl::StrAppendFormat(&out, "\n  host   %s  %s model of %s", Bar({{double(host_model), '#'}}, double(host_capacity), bar),
                        FormatSize(host_model), FormatSize(host_capacity));
  if (p.peak_host_model_bytes() > 0) absl::StrAppend(&out, " (step's peak ", FormatSize(p.peak_host_model_bytes()), ")");
  out += "\n";
  if (disk) {
    absl::StrAppendFormat(&out, "  disk   %s  %s model of %s, %d chunks' gradients and optimizer states\n",
                          Bar({{double(disk_model), '#'}}, double(disk_capacity), bar), FormatSize(disk_model),
                          FormatSize(disk_capacity), p.disk_chunks());
  }

  // Moves.
  absl::StrAppendFormat(&out, "moved   host->device %s, device->host %s", FormatSize(p.bytes_host_to_device()),
                        FormatSize(p.bytes_device_to_host()));
  if (disk) {
    absl::StrAppendFormat(&out, ", host->disk %s, disk->host %s", FormatSize(p.bytes_host_to_disk()),
                          FormatSize(p.bytes_disk_to_host()));
  }
  absl::StrAppendFormat(&out, " this step; %d evictions, prefetch %d hit / %d missed\n", p.evictions(),
                        p.prefetch_hits(), p.prefetch_misses());

  // Where the time went.
  const ferry::v1::StepTimes& t = p.step_times();
  const double total = t.data_seconds() + t.forward_seconds() + t.backward_seconds() + t.optimizer_seconds();
  if (total > 0) {
    // Waiting for the disk is part of the optimizer's time: its cells ('w')
    // come out of the optimizer's ('o').
    const double disk_wait = std::min(t.disk_seconds(), t.optimizer_seconds());
    absl::StrAppendFormat(&out, "time    %s  data %s, forward %s, backward %s, optimizer %s; copying chunks %s",
                          Bar({{t.data_seconds(), 'd'}, {t.forward_seconds(), 'f'}, {t.backward_seconds(), 'b'},
                               {t.optimizer_seconds() - disk_wait, 'o'}, {disk_wait, 'w'}},
                              total, bar),
                          Percent(t.data_seconds(), total), Percent(t.forward_seconds(), total),
                          Percent(t.backward_seconds(), total), Percent(t.optimizer_seconds(), total),
                          Percent(t.transfer_seconds(), total));
    if (disk || t.disk_seconds() > 0) absl::StrAppend(&out, ", waiting for disk ", Percent(t.disk_seconds(), total));
    out += "\n";
  }
  std::string extra = absl::StrCat("phase ", p.memory_phase().empty() ? "-" : p.memory_phase());
  if (p.memory_phase() == "steady") absl::StrAppendFormat(&extra, ", prediction error %.1f%%", 100 * p.prediction_error());
  if (p.recomputed_blocks_size() > 0) {
    absl::StrAppend(&extra, ", recomputing ", p.recomputed_blocks_size(), " of ", job.spec().model().layers(), " blocks");
  }
  if (p.loss_scale() != 0 && p.loss_scale() != 1) absl::StrAppendFormat(&extra, ", loss scale %g (%d skipped)", p.loss_scale(), p.skipped_steps());
  return out + "        " + extra + "\n";
}

std::string ToJson(const google::protobuf::Message& message, bool multiline) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.add_whitespace = multiline;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!json.empty() && json.back() != '\n') json += '\n';
  return json;
}

}  // namespace ferry
