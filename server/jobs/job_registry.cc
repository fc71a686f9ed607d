#include "server/jobs/job_registry.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/escaping.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "server/common/enum_names.h"
#include "server/common/proto_time.h"

namespace ferry {
namespace {

using ferry::v1::Job;
using ferry::v1::JobEvent;
using ferry::v1::JobState;


std::string DeterministicBytes(const ferry::v1::JobSpec& spec) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  spec.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

std::string PageToken(uint64_t after_order) {
  return absl::WebSafeBase64Escape(absl::StrCat("after:", after_order));
}

bool ParsePageToken(const std::string& token, uint64_t* after_order) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return false;
  absl::string_view rest = raw;
  return absl::ConsumePrefix(&rest, "after:") && absl::SimpleAtoi(rest, after_order);
}

}  // namespace

JobRegistry::JobRegistry(JobRegistryOptions options, JobListener* listener)
    : options_(options), listener_(listener), id_rng_(std::random_device{}()) {}

std::string JobRegistry::NewId() {
  for (;;) {
    std::string id = absl::StrFormat("j-%08x", static_cast<uint32_t>(id_rng_()));
    if (!jobs_.contains(id)) return id;
  }
}

JobRegistry::Record* JobRegistry::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobRegistry::Record* JobRegistry::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::Status JobRegistry::NotFound(const std::string& id) const {
  return absl::NotFoundError(
      absl::StrCat("job_id: no job '", id, "' on this daemon; `ferry list` shows the jobs"));
}

void JobRegistry::FlushProgressEvent(Record& record) {
  if (!record.progress_event_pending) return;
  JobEvent event;
  *event.mutable_progress() = record.job.progress();
  record.events->Append(std::move(event));
  record.progress_event_pending = false;
}

void JobRegistry::SetState(Record& record, JobState to, const std::string& reason) {
  // Watchers get the last step's progress before the change.
  FlushProgressEvent(record);
  const JobState from = record.job.state();
  record.job.set_state(to);
  const absl::Time now = absl::Now();
  // A job that resumes keeps the time of its first start.
  if (to == ferry::v1::JOB_STATE_RUNNING && !record.job.has_start_time()) {
    ToProtoTime(now, record.job.mutable_start_time());
  }
  if (IsTerminalState(to)) {
    ToProtoTime(now, record.job.mutable_end_time());
    record.job.set_error(reason);
    record.job.set_cancel_requested(false);
  }
  JobEvent event;
  ToProtoTime(now, event.mutable_time());
  event.mutable_state_change()->set_from(from);
  event.mutable_state_change()->set_to(to);
  event.mutable_state_change()->set_reason(reason);
  record.events->Append(std::move(event));
  if (listener_ != nullptr) {
    if (to == ferry::v1::JOB_STATE_RUNNING) listener_->OnRunning(record.job);
    listener_->OnStateChange(from, to);
  }
  if (IsTerminalState(to)) {
    record.events->Close();
    record.events->Shrink(options_.finished_event_buffer_events);
    finished_.push_back(record.job.id());
    ForgetOldFinished();
  }
}

void JobRegistry::ForgetOldFinished() {
  while (finished_.size() > std::max<size_t>(1, options_.max_finished_jobs)) {
    auto it = jobs_.find(finished_.front());
    finished_.pop_front();
    if (it == jobs_.end()) continue;
    by_order_.erase(it->second.order);
    if (!it->second.job.request_id().empty()) by_request_id_.erase(it->second.job.request_id());
    if (options_.store != nullptr) {
      if (absl::Status s = options_.store->Delete(it->first); !s.ok()) LOG(ERROR) << s.message();
    }
    jobs_.erase(it);  // watchers keep the event buffer alive as long as they need it
  }
}

absl::Status JobRegistry::Write(Record& record) {
  if (options_.store == nullptr) return absl::OkStatus();
  JobStore::Row row;
  row.job = record.job;
  row.submitted_spec = record.submitted_spec;
  row.order = record.order;
  row.last_seq = record.events->last_seq();
  row.failed_runs = record.failed_runs;
  absl::Status s = options_.store->Put(row);
  if (!s.ok()) LOG(ERROR) << "job " << record.job.id() << " not saved: " << s.message();
  return s;
}

absl::StatusOr<size_t> JobRegistry::Recover() {
  if (options_.store == nullptr) return 0;
  absl::StatusOr<std::vector<JobStore::Row>> rows = options_.store->LoadAll();
  if (!rows.ok()) return rows.status();
  absl::MutexLock lock(&mu_);
  std::vector<std::string> interrupted;
  std::vector<std::string> pending;
  for (JobStore::Row& row : *rows) {
    const std::string id = row.job.id();
    Record& record = jobs_[id];
    record.job = std::move(row.job);
    record.submitted_spec = std::move(row.submitted_spec);
    record.order = row.order;
    record.failed_runs = row.failed_runs;
    record.events = std::make_shared<EventBuffer>(options_.event_buffer_events, row.last_seq);
    record.stop = std::make_shared<StopSignal>();
    next_order_ = std::max(next_order_, record.order + 1);
    by_order_[record.order] = id;
    if (!record.job.request_id().empty()) by_request_id_[record.job.request_id()] = id;
    const JobState state = record.job.state();
    if (listener_ != nullptr) listener_->OnStateChange(ferry::v1::JOB_STATE_UNSPECIFIED, state);
    if (state == ferry::v1::JOB_STATE_PENDING) {
      pending.push_back(id);
    } else if (state == ferry::v1::JOB_STATE_RUNNING) {
      interrupted.push_back(id);
    } else {
      record.events->Close();
      record.events->Shrink(options_.finished_event_buffer_events);
      finished_.push_back(id);
    }
  }
  // Runs the daemon's stop cut short: they resume before the queue moves on
  // (they had started first), unless they keep being interrupted.
  for (const std::string& id : interrupted) {
    Record& record = jobs_.at(id);
    record.job.set_interrupted_runs(record.job.interrupted_runs() + 1);
    record.job.set_cancel_requested(false);
    const uint32_t run = record.job.attempts();
    if (record.job.interrupted_runs() > options_.max_interrupted_runs) {
      SetState(record, ferry::v1::JOB_STATE_FAILED,
               absl::StrCat("the daemon stopped ", record.job.interrupted_runs(),
                            " times while this job ran, more than --max_interrupted_runs=",
                            options_.max_interrupted_runs, "; see the daemon's log for why, then submit it again"));
    } else {
      SetState(record, ferry::v1::JOB_STATE_PENDING,
               absl::StrCat("the daemon stopped while run ", run, " ran; the job resumes ",
                            record.job.spec().checkpoint().dir().empty() ? "from step 0 (no checkpoint.dir)"
                                                                          : "from its newest checkpoint"));
      pending_.push_back(id);
    }
    (void)Write(record);
  }
  for (const std::string& id : pending) pending_.push_back(id);
  ForgetOldFinished();
  return rows->size();
}

absl::StatusOr<Job> JobRegistry::Submit(const ferry::v1::JobSpec& submitted,
                                        const ferry::v1::JobSpec& resolved,
                                        const std::string& request_id) {
  const std::string submitted_bytes = DeterministicBytes(submitted);
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return absl::UnavailableError(
        absl::StrCat("the daemon is shutting down (", drain_reason_, "); submit again later"));
  }
  if (!request_id.empty()) {
    auto it = by_request_id_.find(request_id);
    if (it != by_request_id_.end()) {
      const Record* existing = Find(it->second);
      if (existing->submitted_spec == submitted_bytes) return existing->job;
      return absl::AlreadyExistsError(absl::StrCat(
          "request_id: '", request_id, "' was already used for job ", it->second,
          " with a different spec; use a new request_id"));
    }
  }
  if (pending_.size() >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full (", options_.max_queued_jobs,
        " pending jobs); wait for jobs to finish or cancel some"));
  }
  const std::string id = NewId();
  Record& record = jobs_[id];
  record.job.set_id(id);
  *record.job.mutable_spec() = resolved;
  record.job.set_request_id(request_id);
  record.job.mutable_progress()->set_total_steps(resolved.train().steps());
  ToProtoTime(absl::Now(), record.job.mutable_create_time());
  record.submitted_spec = submitted_bytes;
  record.order = next_order_++;
  record.events = std::make_shared<EventBuffer>(options_.event_buffer_events);
  record.stop = std::make_shared<StopSignal>();
  by_order_[record.order] = id;
  if (!request_id.empty()) by_request_id_[request_id] = id;
  SetState(record, ferry::v1::JOB_STATE_PENDING, "");
  if (absl::Status s = Write(record); !s.ok()) {
    // Not accepted: nothing a client was told about may be lost.
    by_order_.erase(record.order);
    if (!request_id.empty()) by_request_id_.erase(request_id);
    if (listener_ != nullptr) listener_->OnStateChange(ferry::v1::JOB_STATE_PENDING, ferry::v1::JOB_STATE_UNSPECIFIED);
    jobs_.erase(id);
    return absl::UnavailableError(absl::StrCat("the daemon cannot record the job (", s.message(),
                                               "); submit again once its state directory is writable"));
  }
  pending_.push_back(id);
  return record.job;
}

absl::StatusOr<Job> JobRegistry::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  const Record* record = Find(id);
  if (record == nullptr) return NotFound(id);
  return record->job;
}

absl::StatusOr<JobRegistry::Page> JobRegistry::List(size_t page_size, const std::string& page_token,
                                                    const std::vector<JobState>& states) const {
  uint64_t after = 0;
  if (!page_token.empty() && !ParsePageToken(page_token, &after)) {
    return absl::InvalidArgumentError(
        "page_token: not a token from a previous ListJobs reply; leave it empty for the first page");
  }
  absl::MutexLock lock(&mu_);
  Page page;
  for (auto it = by_order_.upper_bound(after); it != by_order_.end(); ++it) {
    const Job& job = jobs_.at(it->second).job;
    if (!states.empty() && std::find(states.begin(), states.end(), job.state()) == states.end()) {
      continue;
    }
    if (page.jobs.size() == page_size) {
      page.next_page_token = PageToken(std::prev(it)->first);
      break;
    }
    page.jobs.push_back(job);
  }
  return page;
}

absl::StatusOr<Job> JobRegistry::Cancel(const std::string& id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return NotFound(id);
  switch (record->job.state()) {
    case ferry::v1::JOB_STATE_PENDING:
      pending_.erase(std::find(pending_.begin(), pending_.end(), id));
      SetState(*record, ferry::v1::JOB_STATE_CANCELLED, reason);
      (void)Write(*record);
      break;
    case ferry::v1::JOB_STATE_RUNNING:
      record->stop->Request(reason);
      record->job.set_cancel_requested(true);
      record->cancelled_by_user = true;
      (void)Write(*record);
      break;
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " has already ended (", StateName(record->job.state()),
          "); only pending or running jobs can be cancelled"));
  }
  return record->job;
}

std::optional<RunnableJob> JobRegistry::TakeNext(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return draining_ || !pending_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (draining_ || pending_.empty()) return std::nullopt;
  const std::string id = pending_.front();
  pending_.pop_front();
  Record& record = jobs_.at(id);
  SetState(record, ferry::v1::JOB_STATE_RUNNING, "");
  (void)Write(record);
  return RunnableJob{id, record.job.spec(), record.stop};
}

void JobRegistry::RecordStarted(const std::string& id, const std::string& device) {
  absl::MutexLock lock(&mu_);
  if (Record* record = Find(id)) {
    record->job.set_device(device);
    (void)Write(*record);
  }
}

void JobRegistry::RecordProgress(const std::string& id, const ferry::v1::Progress& progress) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr || record->job.state() != ferry::v1::JOB_STATE_RUNNING) return;
  const uint64_t previous_tokens = record->job.progress().tokens();
  *record->job.mutable_progress() = progress;
  if (!record->job.has_initial_loss()) record->job.set_initial_loss(progress.loss());
  if (progress.has_initial_eval()) *record->job.mutable_initial_eval() = progress.initial_eval();
  if (progress.has_eval()) *record->job.mutable_last_eval() = progress.eval();
  const absl::Time now = absl::Now();
  record->progress_event_pending = true;
  // A step that evaluated is never folded into a later one's event.
  if (progress.has_eval() || progress.has_initial_eval() ||
      now - record->progress_event_time >= options_.progress_event_interval) {
    FlushProgressEvent(*record);
    record->progress_event_time = now;
  }
  if (now - record->progress_written >= options_.progress_write_interval) {
    record->progress_written = now;
    (void)Write(*record);
  }
  if (listener_ != nullptr) {
    listener_->OnProgress(progress,
                          progress.tokens() > previous_tokens ? progress.tokens() - previous_tokens : 0);
  }
}

void JobRegistry::AppendLog(const std::string& id, ferry::v1::Severity severity,
                            const std::string& message) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return;
  JobEvent event;
  event.mutable_log()->set_severity(severity);
  event.mutable_log()->set_message(message);
  record->events->Append(std::move(event));
}

uint32_t JobRegistry::BeginRun(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return 0;
  record->job.set_attempts(record->job.attempts() + 1);
  (void)Write(*record);
  return record->job.attempts();
}

uint32_t JobRegistry::RecordFailedRun(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return 0;
  ++record->failed_runs;
  (void)Write(*record);
  return record->failed_runs;
}

void JobRegistry::RecordCheckpoint(const std::string& id, const ferry::v1::CheckpointInfo& checkpoint) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return;
  ferry::v1::CheckpointInfo* kept = record->job.mutable_last_checkpoint();
  *kept = checkpoint;
  if (!kept->has_time()) ToProtoTime(absl::Now(), kept->mutable_time());
  (void)Write(*record);
  if (listener_ != nullptr) listener_->OnCheckpoint(*kept);
}

void JobRegistry::RecordCheckpointFailed(const std::string& id, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (Find(id) == nullptr) return;
  if (listener_ != nullptr) listener_->OnCheckpointFailed(step);
}

void JobRegistry::RecordPlacement(const std::string& id, const ferry::v1::MemoryPlacement& placement) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return;
  ferry::v1::MemoryPlacement& kept = record->placements[placement.rank()];
  kept = placement;
  kept.set_job_id(id);
  if (kept.world_size() == 0) kept.set_world_size(1);
  if (listener_ != nullptr) listener_->OnPlacement(kept);
}

absl::StatusOr<ferry::v1::MemoryPlacement> JobRegistry::GetPlacement(const std::string& id, uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  const Record* record = Find(id);
  if (record == nullptr) return NotFound(id);
  const ferry::v1::ParallelSpec& parallel = record->job.spec().parallel();
  const uint32_t ranks = std::max<uint32_t>(1, parallel.tensor()) * std::max<uint32_t>(1, parallel.data());
  if (rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank: job ", id, " has ", ranks, ranks == 1 ? " rank" : " ranks",
                                                   "; use 0 to ", ranks - 1));
  }
  auto it = record->placements.find(rank);
  if (it == record->placements.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " has no memory placement", ranks > 1 ? absl::StrCat(" for rank ", rank) : "",
        " yet (it is ", StateName(record->job.state()), "; placement is known from the end of its first step)"));
  }
  return it->second;
}

JobState JobRegistry::Finish(const std::string& id, JobState state, const std::string& error) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return ferry::v1::JOB_STATE_UNSPECIFIED;
  if (IsTerminalState(record->job.state())) return record->job.state();
  if (state == ferry::v1::JOB_STATE_CANCELLED && draining_ && !record->cancelled_by_user) {
    // Stopped only because the daemon is: it resumes at the next start.
    record->job.set_cancel_requested(false);
    SetState(*record, ferry::v1::JOB_STATE_PENDING,
             absl::StrCat(drain_reason_, "; the job resumes ",
                          record->job.spec().checkpoint().dir().empty() ? "from step 0 (no checkpoint.dir)"
                                                                       : "from its newest checkpoint",
                          " when the daemon starts again"));
  } else {
    SetState(*record, state, error);
  }
  (void)Write(*record);
  return record->job.state();
}

JobRegistry::Watch::Watch(JobRegistry* registry, std::string id, Job snapshot,
                          uint64_t snapshot_seq, std::shared_ptr<const EventBuffer> events)
    : registry_(registry),
      id_(std::move(id)),
      snapshot_(std::move(snapshot)),
      snapshot_seq_(snapshot_seq),
      events_(std::move(events)) {}

JobRegistry::Watch::~Watch() { registry_->ReleaseWatcher(id_); }

void JobRegistry::ReleaseWatcher(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (Record* record = Find(id)) --record->watchers;
}

absl::StatusOr<std::unique_ptr<JobRegistry::Watch>> JobRegistry::StartWatch(const std::string& id,
                                                                           uint64_t after_seq) {
  absl::MutexLock lock(&mu_);
  Record* record = Find(id);
  if (record == nullptr) return NotFound(id);
  const uint64_t last = record->events->last_seq();
  if (after_seq > last) {
    return absl::OutOfRangeError(absl::StrCat("after_seq: ", after_seq,
                                              " is beyond the job's last event (", last,
                                              "); use 0 or a seq this job sent"));
  }
  if (after_seq > 0) {
    // Refuse now, before a snapshot is sent, if the resume point is gone.
    std::vector<JobEvent> none;
    if (absl::Status s = record->events->ReadAfter(after_seq, 0, &none); !s.ok()) return s;
  }
  if (record->watchers >= options_.max_watchers_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", id, " already has ", record->watchers, " watchers, the most allowed"));
  }
  ++record->watchers;
  return std::make_unique<Watch>(this, id, record->job, last, record->events);
}

void JobRegistry::BeginDrain(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  drain_reason_ = reason;
  for (auto& [id, record] : jobs_) {
    if (record.job.state() == ferry::v1::JOB_STATE_RUNNING) {
      record.stop->Request(reason);
      record.job.set_cancel_requested(true);
    }
  }
}

bool JobRegistry::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

std::map<JobState, size_t> JobRegistry::CountByState() const {
  absl::MutexLock lock(&mu_);
  std::map<JobState, size_t> counts;
  for (const auto& [id, record] : jobs_) ++counts[record.job.state()];
  return counts;
}

}  // namespace ferry
