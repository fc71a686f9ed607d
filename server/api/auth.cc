#include "server/api/auth.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

constexpr char kHowToSend[] =
    "send `authorization: Bearer TOKEN` metadata; ferry takes --token or FERRY_TOKEN";

grpc::Status Unauthenticated(const std::string& why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
}

}  // namespace

// The role table: every method of ferry.v1.Ferry and the least role that may
// call it. auth_test checks that it covers the whole service.
std::optional<Role> RequiredRole(absl::string_view method) {
  struct Row {
    absl::string_view method;
    Role role;
  };
  static constexpr Row kTable[] = {
      {"GetJob", Role::kViewer},
      {"ListJobs", Role::kViewer},
      {"WatchJob", Role::kViewer},
      {"GetMemoryPlacement", Role::kViewer},
      {"GetDaemonInfo", Role::kViewer},
      {"SubmitJob", Role::kSubmitter},
      {"CancelJob", Role::kSubmitter},
      {"ExportWeights", Role::kSubmitter},
      {"Generate", Role::kSubmitter},
  };
  for (const Row& row : kTable) {
    if (row.method == method) return row.role;
  }
  return std::nullopt;
}

Authorizer::Authorizer(TokenTable tokens)
    : enabled_(true), tokens_(std::make_shared<const TokenTable>(std::move(tokens))) {}

void Authorizer::SetTokens(TokenTable tokens) {
  auto table = std::make_shared<const TokenTable>(std::move(tokens));
  absl::MutexLock lock(&mu_);
  tokens_ = std::move(table);
}

grpc::Status Authorizer::Check(absl::string_view method,
                               const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (!enabled_) return grpc::Status::OK;
  const std::optional<Role> required = RequiredRole(method);
  std::vector<absl::string_view> values;
  auto [begin, end] = metadata.equal_range("authorization");
  for (auto it = begin; it != end; ++it) values.emplace_back(it->second.data(), it->second.size());
  if (values.empty()) {
    return Unauthenticated(absl::StrCat("this ferryd requires a token: ", kHowToSend));
  }
  if (values.size() > 1) {
    return Unauthenticated(absl::StrCat("the call has ", values.size(),
                                        " authorization entries; send one: ", kHowToSend));
  }
  absl::string_view value = values[0];
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() || !absl::StartsWithIgnoreCase(value, kScheme)) {
    return Unauthenticated(absl::StrCat("the authorization metadata is not `Bearer TOKEN`; ", kHowToSend));
  }
  value.remove_prefix(kScheme.size());
  value = absl::StripAsciiWhitespace(value);
  std::shared_ptr<const TokenTable> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  const std::optional<Role> role = tokens->Find(value);
  if (!role.has_value()) {
    return Unauthenticated(
        "the token is not one this ferryd accepts (mistyped, or removed from its tokens file); "
        "ask the daemon's operator for a token and pass it with --token or FERRY_TOKEN");
  }
  if (!required.has_value()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method, " is not in the daemon's role table; no token may call it"));
  }
  if (!RoleAllows(*role, *required)) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat(method, " needs the ", RoleName(*required), " role and this token has the ",
                     RoleName(*role), " role; ask the daemon's operator for a ", RoleName(*required),
                     " token"));
  }
  return grpc::Status::OK;
}

absl::string_view RefusalCodeName(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAUTHENTICATED ? "UNAUTHENTICATED" : "PERMISSION_DENIED";
}

std::optional<std::string> RefusalLog::Line(absl::string_view method, absl::string_view peer,
                                            const grpc::Status& status, int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  if (last_ms_ != INT64_MIN && now_ms > last_ms_) {
    ration_ = std::min(kBurst, ration_ + static_cast<double>(now_ms - last_ms_) / 1000.0 * kPerSecond);
  }
  last_ms_ = std::max(last_ms_, now_ms);
  if (ration_ < 1) {
    ++unlogged_;
    return std::nullopt;
  }
  ration_ -= 1;
  std::string line = absl::StrCat("refused ", method, " from ", peer, ": ", RefusalCodeName(status.error_code()),
                                  ": ", status.error_message());
  if (unlogged_ > 0) {
    absl::StrAppend(&line, " (and ", unlogged_, " more refusals since the previous line were not logged)");
  }
  unlogged_ = 0;
  return line;
}

grpc::Status AuthorizedFerryService::Authorize(absl::string_view method, grpc::ServerContext* context) {
  grpc::Status status = authorizer_->Check(method, context->client_metadata());
  if (status.ok()) return status;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  if (std::optional<std::string> line = refusal_log_.Line(method, context->peer(), status, now_ms)) {
    LOG(WARNING) << *line;
  }
  if (on_refused_) on_refused_(method, status.error_code());
  return status;
}

#define FERRY_AUTHORIZE(method)                                                 \
  if (grpc::Status status = Authorize(method, context); !status.ok()) return status

grpc::Status AuthorizedFerryService::SubmitJob(grpc::ServerContext* context,
                                               const ferry::v1::SubmitJobRequest* request,
                                               ferry::v1::Job* response) {
  FERRY_AUTHORIZE("SubmitJob");
  return inner_->SubmitJob(context, request, response);
}

grpc::Status AuthorizedFerryService::GetJob(grpc::ServerContext* context,
                                            const ferry::v1::GetJobRequest* request,
                                            ferry::v1::Job* response) {
  FERRY_AUTHORIZE("GetJob");
  return inner_->GetJob(context, request, response);
}

grpc::Status AuthorizedFerryService::ListJobs(grpc::ServerContext* context,
                                              const ferry::v1::ListJobsRequest* request,
                                              ferry::v1::ListJobsResponse* response) {
  FERRY_AUTHORIZE("ListJobs");
  return inner_->ListJobs(context, request, response);
}

grpc::Status AuthorizedFerryService::CancelJob(grpc::ServerContext* context,
                                               const ferry::v1::CancelJobRequest* request,
                                               ferry::v1::Job* response) {
  FERRY_AUTHORIZE("CancelJob");
  return inner_->CancelJob(context, request, response);
}

grpc::Status AuthorizedFerryService::WatchJob(grpc::ServerContext* context,
                                              const ferry::v1::WatchJobRequest* request,
                                              grpc::ServerWriter<ferry::v1::JobEvent>* writer) {
  FERRY_AUTHORIZE("WatchJob");
  return inner_->WatchJob(context, request, writer);
}

grpc::Status AuthorizedFerryService::GetDaemonInfo(grpc::ServerContext* context,
                                                   const ferry::v1::GetDaemonInfoRequest* request,
                                                   ferry::v1::DaemonInfo* response) {
  FERRY_AUTHORIZE("GetDaemonInfo");
  return inner_->GetDaemonInfo(context, request, response);
}

grpc::Status AuthorizedFerryService::GetMemoryPlacement(
    grpc::ServerContext* context, const ferry::v1::GetMemoryPlacementRequest* request,
    ferry::v1::MemoryPlacement* response) {
  FERRY_AUTHORIZE("GetMemoryPlacement");
  return inner_->GetMemoryPlacement(context, request, response);
}

grpc::Status AuthorizedFerryService::ExportWeights(grpc::ServerContext* context,
                                                   const ferry::v1::ExportWeightsRequest* request,
                                                   grpc::ServerWriter<ferry::v1::ExportChunk>* writer) {
  FERRY_AUTHORIZE("ExportWeights");
  return inner_->ExportWeights(context, request, writer);
}

grpc::Status AuthorizedFerryService::Generate(grpc::ServerContext* context,
                                              const ferry::v1::GenerateRequest* request,
                                              grpc::ServerWriter<ferry::v1::GenerateResponse>* writer) {
  FERRY_AUTHORIZE("Generate");
  return inner_->Generate(context, request, writer);
}

#undef FERRY_AUTHORIZE

}  // namespace ferry
