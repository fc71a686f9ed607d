#include "server/daemon.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/host_info.h"
#include "engine/common/safe_path.h"
#include "server/api/auth.h"
#include "server/api/ferry_service.h"
#include "server/api/tokens.h"
#include "server/common/files.h"
#include "server/common/proto_time.h"
#include "server/common/sd_notify.h"
#include "server/common/version.h"
#include "server/jobs/job_registry.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/job_store.h"
#include "server/metrics/daemon_metrics.h"
#include "server/worker/probe.h"
#include "server/worker/process_executor.h"

namespace ferry {
namespace {

constexpr char kServiceName[] = "ferry.v1.Ferry";

// The default --allowed_roots: the state directory, and the home
// directory of the user the daemon runs as (unless that is "/", which would
// confine nothing).
std::vector<std::string> DefaultAllowedRoots(const std::string& state_dir) {
  std::vector<std::string> roots = {state_dir};
  std::string home;
  if (const char* env = std::getenv("HOME"); env != nullptr && env[0] == '/') home = env;
  if (home.empty()) {
    if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) home = pw->pw_dir;
  }
  struct stat st;
  if (!home.empty() && stat(home.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && NormalizePath(home) != "/") {
    roots.push_back(home);
  }
  return roots;
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
}

// A secret file that every user may read or write deserves a warning.
void WarnIfOpen(const char* flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & S_IRWXO) != 0) {
    LOG(WARNING) << "--" << flag << "=" << path
                 << " can be read or written by every user of this machine; chmod o-rwx it";
  }
}

// Reads a PEM file named by --`flag`; `kind` is what its BEGIN line names
// ("CERTIFICATE", "PRIVATE KEY").
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path, const char* kind) {
  absl::StatusOr<std::string> pem = ReadFileToString(path);
  if (!pem.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, "=", path, ": cannot read it (", pem.status().message(), ")"));
  }
  const size_t begin = pem->find("-----BEGIN ");
  if (begin == std::string::npos || pem->find(kind, begin) == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat("--", flag, "=", path, ": not a PEM ",
                                                      absl::AsciiStrToLower(kind), " (no -----BEGIN ",
                                                      kind, "----- line)"));
  }
  return pem;
}

// The gRPC port's credentials from the TLS flags: plaintext without them.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const DaemonOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca: client certificates need TLS; give --tls_cert and --tls_key too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert: needs --tls_key, the certificate's private key");
  }
  if (options.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls_key: needs --tls_cert, the server's certificate");
  }
  absl::StatusOr<std::string> cert = ReadPem("tls_cert", options.tls_cert, "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls_key", options.tls_key, "PRIVATE KEY");
  if (!key.ok()) return key.status();
  WarnIfOpen("tls_key", options.tls_key);
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls_client_ca", options.tls_client_ca, "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    ssl = grpc::SslServerCredentialsOptions(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = *ca;
  }
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)) {}

Daemon::~Daemon() {
  Shutdown("the daemon is stopping");
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::Status Daemon::LockStateDir() {
  const std::string path = options_.state_dir + "/ferryd.lock";
  lock_fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir: cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {0};
    (void)pread(lock_fd_, pid, sizeof(pid) - 1, 0);
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir=", options_.state_dir, " is in use by another ferryd (pid ", pid,
        "); stop it or give this one another --state_dir"));
  }
  const std::string me = std::to_string(getpid());
  if (ftruncate(lock_fd_, 0) != 0 || pwrite(lock_fd_, me.data(), me.size(), 0) < 0) {
    LOG(WARNING) << "cannot record the pid in " << path;
  }
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  if (options_.state_dir.empty()) return absl::InvalidArgumentError("--state_dir: is required");
  if (absl::Status s = MakeDirs(options_.state_dir + "/jobs"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--state_dir: ", s.message()));
  }
  if (absl::Status s = LockStateDir(); !s.ok()) return s;

  metrics_ = std::make_unique<DaemonMetrics>(kFerryVersion, "unknown");
  metrics_->SetCapacity("host", HostMemoryTotalBytes());
  if (!options_.metrics_listen.empty()) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(options_.metrics_listen);
    } catch (const std::exception& e) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--metrics_listen=", options_.metrics_listen, ": cannot listen (", e.what(),
          "); choose another address, or --metrics_listen= to turn metrics off"));
    }
    exposer_->RegisterCollectable(metrics_->registry());
    const std::vector<int> ports = exposer_->GetListeningPorts();
    metrics_address_ = absl::StrCat(HostOf(options_.metrics_listen), ":", ports.empty() ? 0 : ports[0]);
  }

  JobRegistryOptions registry_options;
  registry_options.max_queued_jobs = options_.max_queued_jobs;
  registry_options.event_buffer_events = options_.event_buffer_events;
  registry_options.max_watchers_per_job = options_.max_watchers_per_job;
  registry_options.max_finished_jobs = options_.max_finished_jobs;
  registry_options.max_interrupted_runs = options_.max_interrupted_runs;
  if (options_.progress_events_per_second > 0) {
    registry_options.progress_event_interval = absl::Seconds(1.0 / options_.progress_events_per_second);
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options_.state_dir + "/jobs.db");
  if (!store.ok()) return absl::FailedPreconditionError(absl::StrCat("--state_dir: ", store.status().message()));
  store_ = std::move(*store);
  registry_options.store = store_.get();
  registry_ = std::make_unique<JobRegistry>(registry_options, metrics_.get());
  absl::StatusOr<size_t> recovered = registry_->Recover();
  if (!recovered.ok()) return absl::FailedPreconditionError(absl::StrCat("--state_dir: ", recovered.status().message()));
  if (*recovered > 0) {
    std::map<ferry::v1::JobState, size_t> counts = registry_->CountByState();
    LOG(INFO) << "job store " << store_->path() << ": " << *recovered << " jobs, "
              << counts[ferry::v1::JOB_STATE_PENDING] << " of them queued to run or resume";
  }

  const bool default_roots = options_.allowed_roots.empty();
  absl::StatusOr<AllowedRoots> roots =
      AllowedRoots::Make(default_roots ? DefaultAllowedRoots(options_.state_dir) : options_.allowed_roots);
  if (!roots.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--allowed_roots: ", roots.status().message(), "; give existing directories"));
  }
  LOG(INFO) << "paths in job specs must be inside " << roots->Describe()
            << (default_roots ? " (the default: the state directory and your home directory; set --allowed_roots)"
                              : "");

  FerryServiceOptions service_options;
  service_options.heartbeat_interval = options_.heartbeat_interval;
  service_options.machine.host_memory_bytes = HostMemoryTotalBytes();
  service_options.machine.allowed_roots = *roots;
  service_options.machine.ranks_share_host = true;
  // A job's disk tier defaults to scratch/ in its directory there; its free
  // space is looked at each submit (MachineFacts::disk).
  service_options.machine.default_disk_dir = options_.state_dir + "/jobs";
  service_options.worker_binary = options_.worker_binary;
  service_options.jobs_dir = options_.state_dir + "/jobs";
  service_ = std::make_unique<FerryService>(registry_.get(), service_options);

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ServerCredentialsFor(options_);
  if (!credentials.ok()) return credentials.status();
  if (!options_.tokens_file.empty()) {
    absl::StatusOr<TokenTable> tokens = ReadTokensFile(options_.tokens_file);
    if (!tokens.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--tokens_file=", tokens.status().message()));
    }
    WarnIfOpen("tokens_file", options_.tokens_file);
    LOG(INFO) << "bearer tokens from " << options_.tokens_file << ": " << tokens->Count(Role::kViewer)
              << " viewer, " << tokens->Count(Role::kSubmitter) << " submitter";
    authorizer_ = std::make_unique<Authorizer>(std::move(*tokens));
  } else {
    authorizer_ = std::make_unique<Authorizer>();
  }
  authorized_service_ = std::make_unique<AuthorizedFerryService>(
      service_.get(), authorizer_.get(), [metrics = metrics_.get()](absl::string_view method, grpc::StatusCode code) {
        metrics->OnCallRefused(std::string(method), std::string(RefusalCodeName(code)));
      });
  const bool tls = !options_.tls_cert.empty();
  if (!IsLoopback(HostOf(options_.listen)) && (!tls || options_.tokens_file.empty())) {
    LOG(WARNING) << "--listen=" << options_.listen << " is reachable from other machines "
                 << (tls ? "and any client may call it: give --tokens_file"
                         : "and serves plaintext: give --tls_cert and --tls_key (and --tokens_file)");
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
  // Without this a second daemon could bind the same port and share its
  // traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(authorized_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    if (tls) {
      // The address may be fine and the certificate or key not: try it plaintext.
      grpc::ServerBuilder plain;
      int plain_port = 0;
      plain.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(), &plain_port);
      plain.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
      std::unique_ptr<grpc::Server> probe = plain.BuildAndStart();
      if (probe != nullptr && plain_port != 0) {
        probe->Shutdown();
        return absl::FailedPreconditionError(absl::StrCat(
            "--tls_key=", options_.tls_key, ": gRPC cannot serve TLS with it and --tls_cert=",
            options_.tls_cert, " (is it the certificate's private key?)"));
      }
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--listen=", options_.listen, ": cannot listen there (in use, or not a local address); "
        "choose another HOST:PORT"));
  }
  listen_address_ = absl::StrCat(HostOf(options_.listen), ":", port);
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(false);
  health->SetServingStatus(kServiceName, false);
  LOG(INFO) << "listening on " << listen_address_ << " (not serving until the devices are probed)";

  absl::StatusOr<ferry::internal::DeviceProbe> probe =
      ProbeWorker(options_.worker_binary, absl::Minutes(2));
  if (!probe.ok()) return probe.status();
  ferry::v1::DaemonInfo info;
  info.set_version(kFerryVersion);
  info.set_torch_version(probe->torch_version());
  info.set_host_cpus(static_cast<uint32_t>(HostCpuCount()));
  info.set_host_memory_bytes(HostMemoryTotalBytes());
  info.set_state_dir(options_.state_dir);
  for (const std::string& root : roots->roots()) info.add_allowed_roots(root);
  ToProtoTime(absl::Now(), info.mutable_start_time());
  std::vector<std::string> names;
  bool found = false;
  for (const ferry::v1::Device& device : probe->devices()) {
    names.push_back(device.name());
    const bool chosen = options_.devices == "auto" || options_.devices == device.name() ||
                        (options_.devices == "cuda" && device.name() == "cuda:0");
    if (!chosen) continue;
    found = true;
    *info.add_devices() = device;
    if (options_.devices == "auto") break;  // the first device is the one auto picks
  }
  if (!found) {
    return absl::FailedPreconditionError(absl::StrCat("--devices=", options_.devices,
                                                      ": the workers see only ",
                                                      absl::StrJoin(names, ", ")));
  }
  if (info.devices(0).kind() != "cpu") metrics_->SetCapacity("device", info.devices(0).memory_bytes());
  metrics_->SetTorchVersion(probe->torch_version());
  ferry::v1::Limits* limits = info.mutable_limits();
  limits->set_max_queued_jobs(static_cast<uint32_t>(options_.max_queued_jobs));
  limits->set_max_watchers_per_job(static_cast<uint32_t>(options_.max_watchers_per_job));
  limits->set_event_buffer_events(static_cast<uint32_t>(options_.event_buffer_events));
  limits->set_max_message_bytes(options_.max_message_bytes);

  ProcessExecutorOptions executor_options;
  executor_options.worker_binary = options_.worker_binary;
  executor_options.jobs_dir = options_.state_dir + "/jobs";
  executor_options.device = options_.devices;
  executor_options.allowed_roots = roots->ToFlag();
  executor_options.stop_grace = options_.stop_grace;
  executor_ = std::make_unique<ProcessExecutor>(executor_options);
  runner_ = std::make_unique<JobRunner>(registry_.get(), executor_.get());
  runner_->Start();

  service_->SetReady(info);
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  LOG(INFO) << "serving on " << listen_address_
            << (tls ? (options_.tls_client_ca.empty() ? " (TLS" : " (TLS, client certificates") : " (plaintext")
            << (authorizer_->enabled() ? ", bearer tokens)" : ", no tokens)") << ", metrics on "
            << (metrics_address_.empty() ? "(off)" : metrics_address_) << ", device "
            << info.devices(0).name() << ", state in " << options_.state_dir;

  if (!options_.ready_file.empty()) {
    const std::string ready = absl::StrCat("{\"listen\": \"", listen_address_,
                                           "\", \"metrics_listen\": \"", metrics_address_,
                                           "\", \"pid\": ", getpid(), "}\n");
    if (absl::Status s = WriteFileAtomically(options_.ready_file, ready); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--ready_file: ", s.message()));
    }
  }
  // Under systemd (Type=notify): serving now.
  if (absl::Status s = SdNotify(absl::StrCat("READY=1\nSTATUS=serving on ", listen_address_)); !s.ok()) {
    LOG(WARNING) << s.message();
  }
  return absl::OkStatus();
}

absl::Status Daemon::ReloadTokens() {
  if (options_.tokens_file.empty() || authorizer_ == nullptr) {
    return absl::FailedPreconditionError("no --tokens_file to reload");
  }
  absl::StatusOr<TokenTable> tokens = ReadTokensFile(options_.tokens_file);
  if (!tokens.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--tokens_file=", tokens.status().message(),
                                                      "; keeping the tokens loaded before"));
  }
  WarnIfOpen("tokens_file", options_.tokens_file);
  LOG(INFO) << "bearer tokens reloaded from " << options_.tokens_file << ": "
            << tokens->Count(Role::kViewer) << " viewer, " << tokens->Count(Role::kSubmitter)
            << " submitter";
  authorizer_->SetTokens(std::move(*tokens));
  return absl::OkStatus();
}

void Daemon::Shutdown(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  (void)SdNotify(absl::StrCat("STOPPING=1\nSTATUS=draining: ", reason));
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->GetHealthCheckService()->SetServingStatus(kServiceName, false);
  }
  if (registry_ != nullptr) registry_->BeginDrain(reason);
  if (service_ != nullptr) service_->BeginShutdown();
  if (runner_ != nullptr) {
    LOG(INFO) << "draining: waiting for the running job to stop";
    runner_->Join();
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
  exposer_.reset();
  LOG(INFO) << "stopped";
}

}  // namespace ferry
