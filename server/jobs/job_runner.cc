#include "server/jobs/job_runner.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

#include "server/common/enum_names.h"

namespace ferry {
namespace {

// Forwards what the executor reports to the job's record.
class RegistryListener : public RunListener {
 public:
  RegistryListener(JobRegistry* registry, std::string id) : registry_(registry), id_(std::move(id)) {}
  void OnStarted(const std::string& device) override { registry_->RecordStarted(id_, device); }
  void OnProgress(const ferry::v1::Progress& progress) override {
    registry_->RecordProgress(id_, progress);
  }
  void OnLog(ferry::v1::Severity severity, const std::string& message) override {
    registry_->AppendLog(id_, severity, message);
  }
  void OnPlacement(const ferry::v1::MemoryPlacement& placement) override {
    registry_->RecordPlacement(id_, placement);
  }
  void OnCheckpoint(const ferry::v1::CheckpointInfo& checkpoint) override {
    registry_->RecordCheckpoint(id_, checkpoint);
  }
  void OnCheckpointFailed(uint64_t step) override { registry_->RecordCheckpointFailed(id_, step); }

 private:
  JobRegistry* registry_;
  std::string id_;
};

}  // namespace

JobRunner::JobRunner(JobRegistry* registry, JobExecutor* executor)
    : registry_(registry), executor_(executor) {}

JobRunner::~JobRunner() { Join(); }

void JobRunner::Start() { thread_ = std::thread([this] { Loop(); }); }

void JobRunner::Join() {
  if (thread_.joinable()) thread_.join();
}

void JobRunner::Loop() {
  while (!registry_->draining()) {
    std::optional<RunnableJob> job = registry_->TakeNext(absl::Seconds(1));
    if (!job) continue;
    LOG(INFO) << "job " << job->id << " starting";
    RegistryListener listener(registry_, job->id);
    RunOutcome outcome;
    for (;;) {
      const uint32_t run = registry_->BeginRun(job->id);
      outcome = executor_->Run(job->id, job->spec, *job->stop, &listener);
      if (outcome.state != ferry::v1::JOB_STATE_FAILED || job->stop->requested() || registry_->draining()) {
        break;
      }
      const uint32_t failures = registry_->RecordFailedRun(job->id);
      if (failures > job->spec.max_restarts()) break;
      const std::string resume = job->spec.checkpoint().dir().empty()
                                     ? "from the start (no checkpoint.dir)"
                                     : "from its newest checkpoint";
      LOG(WARNING) << "job " << job->id << " run " << run << " failed: " << outcome.error << "; restarting "
                   << resume;
      listener.OnLog(ferry::v1::SEVERITY_WARNING,
                     absl::StrCat("run ", run, " failed (", outcome.error, "); restarting ", resume, ", ",
                                  job->spec.max_restarts() - failures + 1, " restart(s) left before this one"));
    }
    // Logged once the outcome is recorded: a job logged as ended has ended.
    const ferry::v1::JobState ended = registry_->Finish(job->id, outcome.state, outcome.error);
    if (ended == ferry::v1::JOB_STATE_PENDING) {
      LOG(INFO) << "job " << job->id << " stopped with the daemon; it resumes at the next start";
    } else {
      LOG(INFO) << "job " << job->id << " " << StateName(ended) << (outcome.error.empty() ? "" : ": " + outcome.error);
    }
  }
}

}  // namespace ferry
