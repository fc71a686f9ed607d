#include "server/api/auth.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry {
namespace {

constexpr char kViewerToken[] = "viewer-token-0123456789";
constexpr char kSubmitterToken[] = "submitter-token-0123456789";
constexpr char kOtherToken[] = "another-token-0123456789";

TokenTable Tokens() {
  return TokenTable({{Role::kViewer, kViewerToken}, {Role::kSubmitter, kSubmitterToken}});
}

TEST(RoleTable, CoversEveryMethodOfTheService) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("ferry.v1.Ferry");
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_TRUE(RequiredRole(service->method(i)->name()).has_value())
        << service->method(i)->name() << " is not in the role table in server/api/auth.cc";
  }
  EXPECT_EQ(RequiredRole("SubmitJob"), Role::kSubmitter);
  EXPECT_EQ(RequiredRole("CancelJob"), Role::kSubmitter);
  EXPECT_EQ(RequiredRole("ExportWeights"), Role::kSubmitter);
  EXPECT_EQ(RequiredRole("Generate"), Role::kSubmitter);
  EXPECT_EQ(RequiredRole("GetJob"), Role::kViewer);
  EXPECT_EQ(RequiredRole("ListJobs"), Role::kViewer);
  EXPECT_EQ(RequiredRole("WatchJob"), Role::kViewer);
  EXPECT_EQ(RequiredRole("GetMemoryPlacement"), Role::kViewer);
  EXPECT_EQ(RequiredRole("GetDaemonInfo"), Role::kViewer);
  EXPECT_EQ(RequiredRole("DeleteEverything"), std::nullopt);
}

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(Authorizer, DisabledAllowsEverything) {
  Authorizer authorizer;
  EXPECT_FALSE(authorizer.enabled());
  EXPECT_TRUE(authorizer.Check("SubmitJob", {}).ok());
}

TEST(Authorizer, HeaderForms) {
  Authorizer authorizer(Tokens());
  auto check = [&](const std::string& method, std::vector<std::string> values) {
    Metadata metadata;
    for (const std::string& v : values) metadata.emplace("authorization", v);
    return authorizer.Check(method, metadata);
  };
  const std::string submitter = kSubmitterToken;
  EXPECT_TRUE(check("SubmitJob", {"Bearer " + submitter}).ok());
  EXPECT_TRUE(check("SubmitJob", {"bearer " + submitter}).ok());
  EXPECT_TRUE(check("SubmitJob", {"BEARER   " + submitter + " "}).ok());
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{},
                                             {submitter},
                                             {"Basic " + submitter},
                                             {"Bearer"},
                                             {"Bearer "},
                                             {"Bearer " + submitter + "x"},
                                             {"Bearer " + submitter, "Bearer " + submitter}}) {
    grpc::Status s = check("SubmitJob", bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << (bad.empty() ? "" : bad[0]);
    EXPECT_EQ(s.error_message().find(submitter), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("FERRY_TOKEN"), std::string::npos) << s.error_message();
  }
  grpc::Status denied = check("SubmitJob", {std::string("Bearer ") + kViewerToken});
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(denied.error_message(),
            "SubmitJob needs the submitter role and this token has the viewer role; ask the "
            "daemon's operator for a submitter token");
  EXPECT_EQ(check("Unknown", {"Bearer " + submitter}).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Another key is not a token.
  Metadata other;
  other.emplace("x-token", submitter);
  EXPECT_EQ(authorizer.Check("GetJob", other).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(Authorizer, SetTokensReplacesTheTable) {
  Authorizer authorizer(Tokens());
  Metadata metadata;
  const std::string other = std::string("Bearer ") + kOtherToken;
  metadata.emplace("authorization", other);
  EXPECT_EQ(authorizer.Check("GetJob", metadata).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  authorizer.SetTokens(TokenTable({{Role::kViewer, kOtherToken}}));
  EXPECT_TRUE(authorizer.Check("GetJob", metadata).ok());
  Metadata old;
  const std::string submitter = std::string("Bearer ") + kSubmitterToken;
  old.emplace("authorization", submitter);
  EXPECT_EQ(authorizer.Check("GetJob", old).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// Answers every call with OK (streams send one message): a call that gets
// through the check reaches it.
class OkService final : public ferry::v1::Ferry::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const ferry::v1::SubmitJobRequest*,
                         ferry::v1::Job* job) override {
    job->set_id("j-submitted");
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const ferry::v1::GetJobRequest*, ferry::v1::Job*) override {
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const ferry::v1::ListJobsRequest*,
                        ferry::v1::ListJobsResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const ferry::v1::CancelJobRequest*, ferry::v1::Job*) override {
    return grpc::Status::OK;
  }
  grpc::Status WatchJob(grpc::ServerContext*, const ferry::v1::WatchJobRequest*,
                        grpc::ServerWriter<ferry::v1::JobEvent>* writer) override {
    writer->Write(ferry::v1::JobEvent());
    return grpc::Status::OK;
  }
  grpc::Status GetDaemonInfo(grpc::ServerContext*, const ferry::v1::GetDaemonInfoRequest*,
                             ferry::v1::DaemonInfo*) override {
    return grpc::Status::OK;
  }
  grpc::Status GetMemoryPlacement(grpc::ServerContext*, const ferry::v1::GetMemoryPlacementRequest*,
                                  ferry::v1::MemoryPlacement*) override {
    return grpc::Status::OK;
  }
  grpc::Status ExportWeights(grpc::ServerContext*, const ferry::v1::ExportWeightsRequest*,
                             grpc::ServerWriter<ferry::v1::ExportChunk>* writer) override {
    writer->Write(ferry::v1::ExportChunk());
    return grpc::Status::OK;
  }
  grpc::Status Generate(grpc::ServerContext*, const ferry::v1::GenerateRequest*,
                        grpc::ServerWriter<ferry::v1::GenerateResponse>* writer) override {
    writer->Write(ferry::v1::GenerateResponse());
    return grpc::Status::OK;
  }
};

using Call = std::function<grpc::Status(ferry::v1::Ferry::Stub*, grpc::ClientContext*)>;

std::vector<std::pair<std::string, Call>> EveryCall() {
  return {
      {"SubmitJob",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         ferry::v1::Job job;
         return stub->SubmitJob(ctx, ferry::v1::SubmitJobRequest(), &job);
       }},
      {"GetJob",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         ferry::v1::Job job;
         return stub->GetJob(ctx, ferry::v1::GetJobRequest(), &job);
       }},
      {"ListJobs",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         ferry::v1::ListJobsResponse response;
         return stub->ListJobs(ctx, ferry::v1::ListJobsRequest(), &response);
       }},
      {"CancelJob",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         ferry::v1::Job job;
         return stub->CancelJob(ctx, ferry::v1::CancelJobRequest(), &job);
       }},
      {"WatchJob",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         auto reader = stub->WatchJob(ctx, ferry::v1::WatchJobRequest());
         ferry::v1::JobEvent event;
         while (reader->Read(&event)) {
         }
         return reader->Finish();
       }},
      {"GetDaemonInfo",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         ferry::v1::DaemonInfo info;
         return stub->GetDaemonInfo(ctx, ferry::v1::GetDaemonInfoRequest(), &info);
       }},
      {"GetMemoryPlacement",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         ferry::v1::MemoryPlacement placement;
         return stub->GetMemoryPlacement(ctx, ferry::v1::GetMemoryPlacementRequest(), &placement);
       }},
      {"ExportWeights",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         auto reader = stub->ExportWeights(ctx, ferry::v1::ExportWeightsRequest());
         ferry::v1::ExportChunk chunk;
         while (reader->Read(&chunk)) {
         }
         return reader->Finish();
       }},
      {"Generate",
       [](ferry::v1::Ferry::Stub* stub, grpc::ClientContext* ctx) {
         auto reader = stub->Generate(ctx, ferry::v1::GenerateRequest());
         ferry::v1::GenerateResponse response;
         while (reader->Read(&response)) {
         }
         return reader->Finish();
       }},
  };
}

class AuthorizedServiceTest : public ::testing::Test {
 protected:
  void StartServer(Authorizer* authorizer) {
    service_ = std::make_unique<AuthorizedFerryService>(
        &inner_, authorizer, [this](absl::string_view method, grpc::StatusCode code) {
          absl::MutexLock lock(&mu_);
          ++refused_[{std::string(method), code}];
        });
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = ferry::v1::Ferry::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  grpc::Status CallWith(const Call& call, const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return call(stub_.get(), &ctx);
  }

  int Refused(const std::string& method, grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    return refused_[{method, code}];
  }

  OkService inner_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, grpc::StatusCode>, int> refused_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AuthorizedFerryService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ferry::v1::Ferry::Stub> stub_;
};

TEST_F(AuthorizedServiceTest, EveryMethodTimesEveryCaller) {
  Authorizer authorizer(Tokens());
  StartServer(&authorizer);
  const std::vector<std::pair<std::string, Call>> calls = EveryCall();
  ASSERT_EQ(static_cast<int>(calls.size()),
            google::protobuf::DescriptorPool::generated_pool()
                ->FindServiceByName("ferry.v1.Ferry")
                ->method_count());
  for (const auto& [method, call] : calls) {
    const bool needs_submitter = *RequiredRole(method) == Role::kSubmitter;
    grpc::Status none = CallWith(call, "");
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_NE(none.error_message().find("authorization: Bearer TOKEN"), std::string::npos);

    grpc::Status bad = CallWith(call, kOtherToken);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_EQ(bad.error_message().find(kOtherToken), std::string::npos) << bad.error_message();

    grpc::Status viewer = CallWith(call, kViewerToken);
    EXPECT_EQ(viewer.error_code(),
              needs_submitter ? grpc::StatusCode::PERMISSION_DENIED : grpc::StatusCode::OK)
        << method << ": " << viewer.error_message();
    EXPECT_EQ(viewer.error_message().find(kViewerToken), std::string::npos) << viewer.error_message();

    grpc::Status submitter = CallWith(call, kSubmitterToken);
    EXPECT_TRUE(submitter.ok()) << method << ": " << submitter.error_message();

    // Each refusal, and only those, reaches the observer.
    EXPECT_EQ(Refused(method, grpc::StatusCode::UNAUTHENTICATED), 2) << method;
    EXPECT_EQ(Refused(method, grpc::StatusCode::PERMISSION_DENIED), needs_submitter ? 1 : 0) << method;
  }
}

TEST(RefusalLog, ABurstThenOneLineASecondCountingTheRest) {
  RefusalLog log;
  const grpc::Status denied(grpc::StatusCode::PERMISSION_DENIED, "SubmitJob needs the submitter role");
  const grpc::Status unauthenticated(grpc::StatusCode::UNAUTHENTICATED, "this ferryd requires a token");
  std::optional<std::string> first = log.Line("SubmitJob", "ipv4:127.0.0.1:4242", denied, 5000);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "refused SubmitJob from ipv4:127.0.0.1:4242: PERMISSION_DENIED: SubmitJob needs the "
                    "submitter role");
  for (int i = 1; i < RefusalLog::kBurst; ++i) {
    EXPECT_TRUE(log.Line("GetJob", "ipv4:127.0.0.1:4243", unauthenticated, 5000 + i).has_value()) << i;
  }
  EXPECT_FALSE(log.Line("GetJob", "ipv4:127.0.0.1:4243", unauthenticated, 5100).has_value());
  EXPECT_FALSE(log.Line("GetJob", "ipv4:127.0.0.1:4243", unauthenticated, 5900).has_value());
  std::optional<std::string> next = log.Line("GetJob", "ipv4:127.0.0.1:4244", unauthenticated, 6100);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, "refused GetJob from ipv4:127.0.0.1:4244: UNAUTHENTICATED: this ferryd requires a token "
                   "(and 2 more refusals since the previous line were not logged)");
  EXPECT_FALSE(log.Line("GetJob", "ipv4:127.0.0.1:4244", unauthenticated, 6200).has_value());
  // A quiet minute refills the burst; its first line counts the one at 6200.
  for (int i = 0; i < RefusalLog::kBurst; ++i) {
    std::optional<std::string> quiet = log.Line("GetJob", "ipv4:127.0.0.1:4245", unauthenticated, 70000 + i);
    ASSERT_TRUE(quiet.has_value()) << i;
    EXPECT_EQ(quiet->find("(and 1 more refusals since") != std::string::npos, i == 0) << i << ": " << *quiet;
    EXPECT_EQ(quiet->find("more refusals") != std::string::npos, i == 0) << i << ": " << *quiet;
  }
}

TEST_F(AuthorizedServiceTest, WithoutTokensEveryCallGetsThrough) {
  Authorizer authorizer;
  StartServer(&authorizer);
  for (const auto& [method, call] : EveryCall()) {
    EXPECT_TRUE(CallWith(call, "").ok()) << method;
    EXPECT_TRUE(CallWith(call, kOtherToken).ok()) << method;
  }
}

}  // namespace
}  // namespace ferry
