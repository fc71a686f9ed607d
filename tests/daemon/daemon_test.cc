#include "server/daemon.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "ferry_test/reflection.pb.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"

namespace ferry {
namespace {

using grpc::health::v1::HealthCheckResponse;

std::string TempDir(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string WorkerBinary() {
  const char* runfiles = std::getenv("TEST_SRCDIR");
  return std::string(runfiles ? runfiles : ".") + "/ferry/server/ferry-worker";
}

DaemonOptions Options(const std::string& name) {
  DaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.state_dir = TempDir(name);
  o.worker_binary = WorkerBinary();
  return o;
}

std::shared_ptr<grpc::Channel> Connect(const Daemon& daemon) {
  return grpc::CreateChannel(daemon.listen_address(), grpc::InsecureChannelCredentials());
}

HealthCheckResponse::ServingStatus Health(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::Status s = stub->Check(&ctx, request, &response);
  return s.ok() ? response.status() : HealthCheckResponse::UNKNOWN;
}

TEST(DaemonTest, ServesHealthReflectionAndInfoOnceStarted) {
  Daemon daemon(Options("serving"));
  ASSERT_TRUE(daemon.Start().ok());
  auto channel = Connect(daemon);
  EXPECT_EQ(Health(channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(channel, "ferry.v1.Ferry"), HealthCheckResponse::SERVING);
  EXPECT_FALSE(daemon.metrics_address().empty());

  // The reflection service's bidirectional stream, called the way generated
  // stubs do.
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<ferry::test::reflection::ServerReflectionRequest,
                                           ferry::test::reflection::ServerReflectionResponse>>
      stream(grpc::internal::ClientReaderWriterFactory<
             ferry::test::reflection::ServerReflectionRequest,
             ferry::test::reflection::ServerReflectionResponse>::Create(channel.get(), method, &ctx));
  ferry::test::reflection::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  stream->WritesDone();
  ferry::test::reflection::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.push_back(s.name());
  EXPECT_NE(std::find(services.begin(), services.end(), "ferry.v1.Ferry"), services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());
  while (stream->Read(&response)) {
  }
  stream->Finish();

  auto ferry = ferry::v1::Ferry::NewStub(channel);
  grpc::ClientContext info_ctx;
  ferry::v1::DaemonInfo info;
  ASSERT_TRUE(ferry->GetDaemonInfo(&info_ctx, ferry::v1::GetDaemonInfoRequest(), &info).ok());
  EXPECT_FALSE(info.version().empty());
  EXPECT_FALSE(info.torch_version().empty());
  ASSERT_EQ(info.devices_size(), 1);
  EXPECT_EQ(info.devices(0).name(), "cpu");  // no GPU on the test machines
  EXPECT_GT(info.devices(0).memory_bytes(), 0u);
  EXPECT_EQ(info.limits().max_queued_jobs(), 1000u);
  EXPECT_EQ(info.state_dir(), TempDir("serving"));
  daemon.Shutdown("test over");
}

TEST(DaemonTest, StartUpErrorsNameTheFlag) {
  Daemon first(Options("shared"));
  ASSERT_TRUE(first.Start().ok());

  Daemon same_dir(Options("shared"));
  absl::Status s = same_dir.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("is in use by another ferryd"), std::string::npos) << s;

  DaemonOptions port_taken = Options("port_taken");
  port_taken.listen = first.listen_address();
  s = Daemon(port_taken).Start();
  EXPECT_NE(s.message().find("--listen="), std::string::npos) << s;

  DaemonOptions metrics_taken = Options("metrics_taken");
  metrics_taken.metrics_listen = first.metrics_address();
  s = Daemon(metrics_taken).Start();
  EXPECT_NE(s.message().find("--metrics_listen="), std::string::npos) << s;

  DaemonOptions no_worker = Options("no_worker");
  no_worker.worker_binary = "/nonexistent/ferry-worker";
  s = Daemon(no_worker).Start();
  EXPECT_NE(s.message().find("--worker_binary"), std::string::npos) << s;

  DaemonOptions no_gpu = Options("no_gpu");
  no_gpu.devices = "cuda:7";
  s = Daemon(no_gpu).Start();
  EXPECT_NE(s.message().find("--devices=cuda:7: the workers see only"), std::string::npos) << s;
}

// A worker that answers the probe, then neither reports nor stops.
std::string StubbornWorker() {
  const std::string path = TempDir("stubborn-worker.sh");
  std::ofstream(path) << "#!/bin/sh\n"
                         "if [ \"$1\" = --probe ]; then\n"
                         "  echo '{\"devices\": [{\"kind\": \"cpu\", \"name\": \"cpu\"}], "
                         "\"torch_version\": \"stub\"}'\n"
                         "  exit 0\n"
                         "fi\n"
                         "exec sleep 60\n";
  chmod(path.c_str(), 0755);
  return path;
}

TEST(DaemonTest, DrainingIsNotServingAndRefusesSubmits) {
  DaemonOptions options = Options("draining");
  options.worker_binary = StubbornWorker();
  options.stop_grace = absl::Seconds(3);
  Daemon daemon(options);
  ASSERT_TRUE(daemon.Start().ok());
  auto channel = Connect(daemon);
  auto ferry = ferry::v1::Ferry::NewStub(channel);

  ferry::v1::SubmitJobRequest submit;
  submit.mutable_spec()->mutable_data()->mutable_synthetic();
  ferry::v1::Job job;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(ferry->SubmitJob(&ctx, submit, &job).ok());
  }
  for (int i = 0; i < 200 && job.state() != ferry::v1::JOB_STATE_RUNNING; ++i) {
    grpc::ClientContext ctx;
    ferry::v1::GetJobRequest get;
    get.set_job_id(job.id());
    ferry->GetJob(&ctx, get, &job);
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(job.state(), ferry::v1::JOB_STATE_RUNNING);

  const absl::Time start = absl::Now();
  std::thread shutdown([&] { daemon.Shutdown("the daemon shut down (test)"); });
  bool saw_not_serving = false;
  for (int i = 0; i < 100 && !saw_not_serving; ++i) {
    saw_not_serving = Health(channel, "") == HealthCheckResponse::NOT_SERVING;
    if (!saw_not_serving) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(saw_not_serving);
  {
    grpc::ClientContext ctx;
    ferry::v1::Job refused;
    grpc::Status s = ferry->SubmitJob(&ctx, submit, &refused);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(s.error_message().find("shutting down"), std::string::npos) << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ferry::v1::GetJobRequest get;
    get.set_job_id(job.id());
    ASSERT_TRUE(ferry->GetJob(&ctx, get, &job).ok()) << "reads still work while draining";
    EXPECT_TRUE(job.cancel_requested());
  }
  shutdown.join();
  // The stubborn worker was killed after the grace period.
  EXPECT_GE(absl::Now() - start, absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace ferry
