#pragma once

// The gRPC handlers of ferry.v1.Ferry: validate the request, call the job
// registry, map the status. No training, placement or storage here.

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "server/jobs/job_registry.h"
#include "server/spec/spec_validator.h"

namespace ferry {

struct FerryServiceOptions {
  // A watcher with nothing else to receive gets a heartbeat this often.
  // Default 5 s.
  absl::Duration heartbeat_interval = absl::Seconds(5);
  // Machine facts for spec validation.
  MachineFacts machine;
  // ExportWeights and Generate run this ferry-worker binary (empty:
  // UNIMPLEMENTED) in the job's directory under jobs_dir (Generate from a
  // weights file: in jobs_dir/generate).
  std::string worker_binary;
  std::string jobs_dir;
};

class FerryService final : public ferry::v1::Ferry::Service {
 public:
  // `registry` must outlive the service.
  FerryService(JobRegistry* registry, FerryServiceOptions options);

  // Until called, every RPC answers UNAVAILABLE ("starting").
  void SetReady(const ferry::v1::DaemonInfo& info) ABSL_LOCKS_EXCLUDED(mu_);
  // Open watch streams end with UNAVAILABLE so clients reconnect elsewhere
  // or later.
  void BeginShutdown();

  grpc::Status SubmitJob(grpc::ServerContext* context, const ferry::v1::SubmitJobRequest* request,
                         ferry::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const ferry::v1::GetJobRequest* request,
                      ferry::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const ferry::v1::ListJobsRequest* request,
                        ferry::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const ferry::v1::CancelJobRequest* request,
                         ferry::v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const ferry::v1::WatchJobRequest* request,
                        grpc::ServerWriter<ferry::v1::JobEvent>* writer) override;
  grpc::Status GetDaemonInfo(grpc::ServerContext* context,
                             const ferry::v1::GetDaemonInfoRequest* request,
                             ferry::v1::DaemonInfo* response) override;
  grpc::Status GetMemoryPlacement(grpc::ServerContext* context,
                                  const ferry::v1::GetMemoryPlacementRequest* request,
                                  ferry::v1::MemoryPlacement* response) override;
  grpc::Status ExportWeights(grpc::ServerContext* context, const ferry::v1::ExportWeightsRequest* request,
                             grpc::ServerWriter<ferry::v1::ExportChunk>* writer) override;
  grpc::Status Generate(grpc::ServerContext* context, const ferry::v1::GenerateRequest* request,
                        grpc::ServerWriter<ferry::v1::GenerateResponse>* writer) override;

 private:
  // UNAVAILABLE until SetReady.
  grpc::Status CheckReady() const ABSL_LOCKS_EXCLUDED(mu_);

  JobRegistry* const registry_;
  const FerryServiceOptions options_;
  std::atomic<bool> shutting_down_{false};
  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  ferry::v1::DaemonInfo info_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry
