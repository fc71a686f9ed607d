#pragma once

// Who may call what: the role each RPC of ferry.v1.Ferry needs (the one role
// table), and the check of a call's `authorization: Bearer TOKEN` metadata
// against the daemon's tokens. AuthorizedFerryService applies the check in
// front of the real handlers; the health and reflection services are not
// behind it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "server/api/tokens.h"

namespace ferry {

// The role a method of ferry.v1.Ferry (its short name, e.g. "SubmitJob")
// needs; nullopt for a name not in the table, which no token may call.
std::optional<Role> RequiredRole(absl::string_view method);

class Authorizer {
 public:
  // Without tokens every call is allowed: ferryd without --tokens_file.
  Authorizer() = default;
  explicit Authorizer(TokenTable tokens);

  bool enabled() const { return enabled_; }

  // Replaces the tokens (a reload). Calls already checked are not affected.
  void SetTokens(TokenTable tokens) ABSL_LOCKS_EXCLUDED(mu_);

  // OK, UNAUTHENTICATED (no token, a malformed header, a token not in the
  // table) or PERMISSION_DENIED (the token's role does not allow `method`).
  // Messages say what to do and never contain the token.
  grpc::Status Check(absl::string_view method,
                     const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool enabled_ = false;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> tokens_ ABSL_GUARDED_BY(mu_);
};

// Told of each call the authorizer refused: the method and the status code
// (UNAUTHENTICATED or PERMISSION_DENIED), e.g. to count it.
using RefusalObserver = std::function<void(absl::string_view method, grpc::StatusCode code)>;

// The name of a refusal's code: "UNAUTHENTICATED" or "PERMISSION_DENIED".
absl::string_view RefusalCodeName(grpc::StatusCode code);

// The log line of a refusal: the method, the caller's address, the code and
// the reason (which never holds the token). Lines are rationed so that a
// flood of refusals cannot fill the log: a burst of 10, then one a second;
// the next line logged tells how many were not.
class RefusalLog {
 public:
  static constexpr double kBurst = 10;
  static constexpr double kPerSecond = 1;

  // Returns the line to log now, or nullopt when the ration is spent (the
  // refusal is counted for the next line).
  std::optional<std::string> Line(absl::string_view method, absl::string_view peer, const grpc::Status& status,
                                  int64_t now_ms) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  double ration_ ABSL_GUARDED_BY(mu_) = kBurst;
  int64_t last_ms_ ABSL_GUARDED_BY(mu_) = INT64_MIN;
  uint64_t unlogged_ ABSL_GUARDED_BY(mu_) = 0;
};

// ferry.v1.Ferry with each call checked by `authorizer` before it reaches
// `inner`; refusals are logged (see RefusalLog) and told to `on_refused`. A
// method added to the service but not here answers UNIMPLEMENTED.
class AuthorizedFerryService final : public ferry::v1::Ferry::Service {
 public:
  // Both must outlive this service.
  AuthorizedFerryService(ferry::v1::Ferry::Service* inner, const Authorizer* authorizer,
                         RefusalObserver on_refused = nullptr)
      : inner_(inner), authorizer_(authorizer), on_refused_(std::move(on_refused)) {}

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
  // The authorizer's verdict on a call, a refusal logged and observed.
  grpc::Status Authorize(absl::string_view method, grpc::ServerContext* context);

  ferry::v1::Ferry::Service* const inner_;
  const Authorizer* const authorizer_;
  const RefusalObserver on_refused_;
  RefusalLog refusal_log_;
};

}  // namespace ferry
