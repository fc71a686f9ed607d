#include "server/api/ferry_service.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/api/grpc_status.h"
#include "server/common/proto_time.h"
#include "server/spec/spec_defaults.h"
#include "server/worker/export_runner.h"
#include "server/worker/generate_request.h"
#include "server/worker/generate_runner.h"

namespace ferry {
namespace {

constexpr size_t kMaxRequestIdLength = 128;
constexpr size_t kMaxJobIdLength = 64;
constexpr uint32_t kDefaultPageSize = 100;
constexpr uint32_t kMaxPageSize = 1000;
// Events sent per read of the buffer.
constexpr size_t kWatchBatch = 256;
// Bytes per ExportChunk.
constexpr size_t kExportChunkBytes = 1 << 20;

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

grpc::Status CheckJobId(const std::string& id) {
  if (id.empty()) return Invalid("job_id: is empty; give a job id such as j-5f2c9a1e");
  if (id.size() > kMaxJobIdLength) return Invalid("job_id: too long to be a job id");
  return grpc::Status::OK;
}

}  // namespace

FerryService::FerryService(JobRegistry* registry, FerryServiceOptions options)
    : registry_(registry), options_(options) {}

void FerryService::SetReady(const ferry::v1::DaemonInfo& info) {
  absl::MutexLock lock(&mu_);
  info_ = info;
  ready_ = true;
}

void FerryService::BeginShutdown() { shutting_down_.store(true); }

grpc::Status FerryService::CheckReady() const {
  absl::MutexLock lock(&mu_);
  if (!ready_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the daemon is starting (probing its devices); retry in a moment");
  }
  return grpc::Status::OK;
}

grpc::Status FerryService::SubmitJob(grpc::ServerContext*, const ferry::v1::SubmitJobRequest* request,
                                     ferry::v1::Job* response) {
  if (grpc::Status s = CheckReady(); !s.ok()) return s;
  if (request->request_id().size() > kMaxRequestIdLength) {
    return Invalid(absl::StrCat("request_id: ", request->request_id().size(),
                                " characters; use at most ", kMaxRequestIdLength));
  }
  absl::StatusOr<ferry::v1::JobSpec> resolved = WithDefaults(request->spec());
  if (!resolved.ok()) return ToGrpcStatus(resolved.status());
  // The machine as probed: the device's memory, or the simulated device's
  // share of host memory.
  MachineFacts machine = options_.machine;
  {
    absl::MutexLock lock(&mu_);
    if (info_.devices_size() > 0) {
      const ferry::v1::Device& device = info_.devices(0);
      if (device.kind() == "cpu") {
        machine.device_is_host_memory = true;
      } else {
        machine.device_memory_bytes = device.memory_bytes();
      }
    }
  }
  if (absl::Status s = ResolveModelFromWeights(&*resolved, machine); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = ValidateSpec(*resolved, machine); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<ferry::v1::Job> job =
      registry_->Submit(request->spec(), *resolved, request->request_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *job;
  return grpc::Status::OK;
}

grpc::Status FerryService::GetJob(grpc::ServerContext*, const ferry::v1::GetJobRequest* request,
                                  ferry::v1::Job* response) {
  if (grpc::Status s = CheckJobId(request->job_id()); !s.ok()) return s;
  absl::StatusOr<ferry::v1::Job> job = registry_->Get(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *job;
  return grpc::Status::OK;
}

grpc::Status FerryService::ListJobs(grpc::ServerContext*, const ferry::v1::ListJobsRequest* request,
                                    ferry::v1::ListJobsResponse* response) {
  const uint32_t page_size = request->page_size() == 0
                                 ? kDefaultPageSize
                                 : std::min(request->page_size(), kMaxPageSize);
  std::vector<ferry::v1::JobState> states;
  for (int s : request->states()) states.push_back(static_cast<ferry::v1::JobState>(s));
  absl::StatusOr<JobRegistry::Page> page = registry_->List(page_size, request->page_token(), states);
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (ferry::v1::Job& job : page->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status FerryService::CancelJob(grpc::ServerContext*, const ferry::v1::CancelJobRequest* request,
                                     ferry::v1::Job* response) {
  if (grpc::Status s = CheckJobId(request->job_id()); !s.ok()) return s;
  absl::StatusOr<ferry::v1::Job> job = registry_->Cancel(request->job_id(), "cancelled by request");
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = *job;
  return grpc::Status::OK;
}

grpc::Status FerryService::WatchJob(grpc::ServerContext* context,
                                    const ferry::v1::WatchJobRequest* request,
                                    grpc::ServerWriter<ferry::v1::JobEvent>* writer) {
  if (grpc::Status s = CheckJobId(request->job_id()); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<JobRegistry::Watch>> watch =
      registry_->StartWatch(request->job_id(), request->after_seq());
  if (!watch.ok()) return ToGrpcStatus(watch.status());
  const EventBuffer& events = (*watch)->events();

  ferry::v1::JobEvent first;
  first.set_seq((*watch)->snapshot_seq());
  ToProtoTime(absl::Now(), first.mutable_time());
  *first.mutable_snapshot() = (*watch)->snapshot();
  if (!writer->Write(first)) return grpc::Status::CANCELLED;

  uint64_t cursor = request->after_seq() == 0 ? (*watch)->snapshot_seq() : request->after_seq();
  absl::Time last_write = absl::Now();
  std::vector<ferry::v1::JobEvent> batch;
  for (;;) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    batch.clear();
    bool ended = false;
    if (absl::Status s = events.ReadAfter(cursor, kWatchBatch, &batch, &ended); !s.ok()) {
      return ToGrpcStatus(s);
    }
    for (const ferry::v1::JobEvent& event : batch) {
      if (!writer->Write(event)) return grpc::Status::CANCELLED;
      cursor = event.seq();
      last_write = absl::Now();
    }
    if (ended) return grpc::Status::OK;  // the job has ended; all sent
    if (!batch.empty()) continue;
    if (shutting_down_.load()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("the daemon is shutting down; watch again with after_seq=",
                                       cursor, " once it is back"));
    }
    const absl::Duration until_heartbeat = options_.heartbeat_interval - (absl::Now() - last_write);
    if (until_heartbeat <= absl::ZeroDuration()) {
      ferry::v1::JobEvent heartbeat;
      heartbeat.set_seq(cursor);
      ToProtoTime(absl::Now(), heartbeat.mutable_time());
      heartbeat.mutable_heartbeat();
      if (!writer->Write(heartbeat)) return grpc::Status::CANCELLED;
      last_write = absl::Now();
      continue;
    }
    // Wake at least every 200 ms to notice cancellation and shutdown.
    events.WaitForEventsAfter(cursor, std::min(until_heartbeat, absl::Milliseconds(200)));
  }
}

grpc::Status FerryService::GetDaemonInfo(grpc::ServerContext*, const ferry::v1::GetDaemonInfoRequest*,
                                         ferry::v1::DaemonInfo* response) {
  if (grpc::Status s = CheckReady(); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  *response = info_;
  return grpc::Status::OK;
}

grpc::Status FerryService::GetMemoryPlacement(grpc::ServerContext*,
                                              const ferry::v1::GetMemoryPlacementRequest* request,
                                              ferry::v1::MemoryPlacement* response) {
  if (grpc::Status s = CheckJobId(request->job_id()); !s.ok()) return s;
  absl::StatusOr<ferry::v1::MemoryPlacement> placement = registry_->GetPlacement(request->job_id(), request->rank());
  if (!placement.ok()) return ToGrpcStatus(placement.status());
  *response = *std::move(placement);
  return grpc::Status::OK;
}

grpc::Status FerryService::ExportWeights(grpc::ServerContext* context,
                                         const ferry::v1::ExportWeightsRequest* request,
                                         grpc::ServerWriter<ferry::v1::ExportChunk>* writer) {
  if (grpc::Status s = CheckJobId(request->job_id()); !s.ok()) return s;
  absl::StatusOr<ferry::v1::Job> job = registry_->Get(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (job->spec().checkpoint().dir().empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("checkpoint.dir: job ", request->job_id(),
                                     " keeps no checkpoints, so there are no weights to export; submit it with "
                                     "checkpoint.dir (and checkpoint.every_steps) set"));
  }
  if (options_.worker_binary.empty() || options_.jobs_dir.empty()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this daemon has no worker binary to export with");
  }
  // The worker reads the checkpoints and writes the file or folder; the
  // daemon only streams it, a file after another.
  absl::StatusOr<ExportedWeights> exported =
      RunWorkerExport(options_.worker_binary, absl::StrCat(options_.jobs_dir, "/", request->job_id()), job->spec(),
                      [context] { return context->IsCancelled(); }, options_.machine.allowed_roots.ToFlag(),
                      request->folder());
  if (!exported.ok()) return ToGrpcStatus(exported.status());
  struct Remove {
    const ExportedWeights& exported;
    ~Remove() { RemoveExport(exported); }
  } cleanup{*exported};
  std::vector<std::string> names = exported->files;
  std::vector<uint64_t> sizes = exported->file_bytes;
  if (!request->folder()) {
    names = {""};
    sizes = {exported->bytes};
  }
  std::string buffer(kExportChunkBytes, '\0');
  for (size_t f = 0; f < names.size(); ++f) {
    const std::string path = request->folder() ? exported->path + "/" + names[f] : exported->path;
    std::ifstream in(path, std::ios::binary);
    if (!in) return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot read ", path));
    uint64_t offset = 0;
    do {
      in.read(&buffer[0], static_cast<std::streamsize>(buffer.size()));
      const size_t got = static_cast<size_t>(in.gcount());
      if (got == 0 && offset > 0) break;
      ferry::v1::ExportChunk chunk;
      chunk.set_data(buffer.data(), got);
      chunk.set_offset(offset);
      chunk.set_total_bytes(sizes[f]);
      chunk.set_tensors(static_cast<uint32_t>(exported->tensors));
      chunk.set_step(static_cast<uint64_t>(exported->step));
      if (request->folder()) {
        chunk.set_file(names[f]);
        chunk.set_files(static_cast<uint32_t>(names.size()));
      }
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      offset += got;
    } while (in);
    if (offset != sizes[f]) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("read ", offset, " of ", path, "'s ", sizes[f], " bytes"));
    }
  }
  return grpc::Status::OK;
}

grpc::Status FerryService::Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                                    grpc::ServerWriter<ferry::v1::GenerateResponse>* writer) {
  if (grpc::Status s = CheckReady(); !s.ok()) return s;
  if (absl::Status s = ValidateGenerateRequest(*request); !s.ok()) return ToGrpcStatus(s);
  const AllowedRoots& roots = options_.machine.allowed_roots;
  std::optional<ferry::v1::Job> job;
  std::string work_dir = absl::StrCat(options_.jobs_dir, "/generate");
  if (request->model_case() == ferry::v1::GenerateRequest::kJobId) {
    if (grpc::Status s = CheckJobId(request->job_id()); !s.ok()) return s;
    absl::StatusOr<ferry::v1::Job> found = registry_->Get(request->job_id());
    if (!found.ok()) return ToGrpcStatus(found.status());
    if (found->spec().checkpoint().dir().empty()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("checkpoint.dir: job ", request->job_id(),
                                       " keeps no checkpoints, so there is no model to generate with; submit it "
                                       "with checkpoint.dir (and checkpoint.every_steps) set"));
    }
    job = *std::move(found);
    work_dir = absl::StrCat(options_.jobs_dir, "/", request->job_id());
  } else {
    if (absl::StatusOr<ResolvedPath> p = CheckConfined(roots, "weights_path", request->weights_path(), PathKind::kFile);
        !p.ok()) {
      return ToGrpcStatus(p.status());
    }
    for (const std::string& file : request->tokenizer_files()) {
      if (absl::StatusOr<ResolvedPath> p = CheckConfined(roots, "tokenizer_files", file, PathKind::kFile); !p.ok()) {
        return ToGrpcStatus(p.status());
      }
    }
  }
  if (options_.worker_binary.empty() || options_.jobs_dir.empty()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this daemon has no worker binary to generate with");
  }
  // The worker loads the model and produces the tokens; the daemon relays
  // each response as it arrives.
  const absl::Status status = RunWorkerGenerate(
      options_.worker_binary, work_dir, job.has_value() ? &job->spec() : nullptr, *request,
      [writer](const ferry::v1::GenerateResponse& response) { return writer->Write(response); },
      [context] { return context->IsCancelled(); }, roots.ToFlag());
  return ToGrpcStatus(status);
}

}  // namespace ferry
