#pragma once

// ferryd's components and their lifetimes: metrics, the job registry, the
// gRPC server (Ferry service, health, reflection), the worker executor and
// the job runner. main() builds one Daemon from flags.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class Server;
}
namespace prometheus {
class Exposer;
}

namespace ferry {

class Authorizer;
class AuthorizedFerryService;
class DaemonMetrics;
class FerryService;
class JobRegistry;
class JobRunner;
class JobStore;
class ProcessExecutor;

struct DaemonOptions {
  // gRPC address. Default loopback only: 127.0.0.1:50051. Port 0 picks one.
  std::string listen = "127.0.0.1:50051";
  // Prometheus /metrics address; empty disables it. Default 127.0.0.1:9464.
  std::string metrics_listen = "127.0.0.1:9464";
  // Where the job store (jobs.db, SQLite) and job directories (spec, worker
  // logs) live. Required.
  std::string state_dir;
  // The ferry-worker binary. Required.
  std::string worker_binary;
  // Device the workers use: auto, cpu, cuda, cuda:N. Default auto.
  std::string devices = "auto";
  // Limits; see JobRegistryOptions.
  size_t max_queued_jobs = 1000;
  size_t event_buffer_events = 4096;
  size_t max_watchers_per_job = 256;
  size_t max_finished_jobs = 10000;
  // Progress events per second per job for watchers (0: one per step).
  // Default 5.
  double progress_events_per_second = 5;
  // A job found running at start resumes at most this many times. Default 3.
  uint32_t max_interrupted_runs = 3;
  // Largest request accepted. Default 4 MiB.
  size_t max_message_bytes = 4 << 20;
  // Heartbeats to idle watchers. Default 5 s.
  absl::Duration heartbeat_interval = absl::Seconds(5);
  // How long a worker may take to stop before it is killed. Default 30 s.
  absl::Duration stop_grace = absl::Seconds(30);
  // If set, written once serving: JSON with the bound addresses and the pid.
  std::string ready_file;
  // Directories every path in a job spec (data.path, checkpoint.dir) must
  // resolve inside; workers open those paths beneath them without following
  // links. Empty: the state directory and the home directory of the user
  // the daemon runs as.
  std::vector<std::string> allowed_roots;
  // TLS for the gRPC port: PEM files of the server's certificate (chain) and
  // private key, both or neither; empty serves plaintext. With tls_client_ca,
  // clients must present a certificate signed by that CA (mTLS).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // If set, every ferry.v1.Ferry call needs `authorization: Bearer TOKEN`
  // with a token from this file (server/api/tokens.h); ReloadTokens rereads it.
  std::string tokens_file;
};

class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();

  // Binds the servers, probes the devices, starts running jobs. Errors name
  // the flag to change.
  absl::Status Start();

  // Stops accepting work (health NOT_SERVING, submits UNAVAILABLE), stops
  // the running job after its current step, closes the servers. Idempotent.
  void Shutdown(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Rereads --tokens_file (on SIGHUP) and logs the tokens per role. A file
  // that does not parse keeps the tokens in use; the error says why.
  absl::Status ReloadTokens();

  // The addresses actually bound (after Start), e.g. "127.0.0.1:50051".
  const std::string& listen_address() const { return listen_address_; }
  const std::string& metrics_address() const { return metrics_address_; }

 private:
  absl::Status LockStateDir();

  DaemonOptions options_;
  std::string listen_address_;
  std::string metrics_address_;
  int lock_fd_ = -1;
  std::unique_ptr<DaemonMetrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<FerryService> service_;
  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<AuthorizedFerryService> authorized_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ProcessExecutor> executor_;
  std::unique_ptr<JobRunner> runner_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry
