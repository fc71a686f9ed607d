// ferryd: the Ferry training daemon.

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <string>
#include <thread>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "server/common/version.h"
#include "server/daemon.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address (HOST:PORT; port 0 picks one).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address (HOST:PORT); empty turns metrics off.");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for the daemon's state and job directories. Default "
          "$FERRY_STATE_DIR, else $XDG_STATE_HOME/ferry, else ~/.local/state/ferry.");
ABSL_FLAG(std::string, devices, "auto", "Device for jobs: auto, cpu, cuda, cuda:N.");
ABSL_FLAG(std::string, worker_binary, "",
          "The ferry-worker binary. Default: ferry-worker beside ferryd.");
ABSL_FLAG(int, max_queued_jobs, 1000, "Pending jobs allowed at once.");
ABSL_FLAG(int, event_buffer_events, 4096, "Events kept per job for watchers that reconnect.");
ABSL_FLAG(int, max_watchers_per_job, 256, "Concurrent WatchJob streams per job.");
ABSL_FLAG(int, max_finished_jobs, 10000,
          "Ended jobs remembered; the oldest beyond this are forgotten.");
ABSL_FLAG(double, progress_events_per_second, 5,
          "Progress events per second per job sent to watchers (the newest progress in between follows, "
          "and the last step's always precedes the job's end); 0 sends one per step. Bounds what many "
          "watchers of a fast job cost the daemon.");
ABSL_FLAG(int, max_interrupted_runs, 3,
          "A job found running when the daemon starts (it stopped without draining: a crash, a kill, a "
          "power cut) resumes from its newest checkpoint at most this many times, then fails.");
ABSL_FLAG(double, heartbeat_seconds, 5, "Heartbeat interval for idle watch streams.");
ABSL_FLAG(double, stop_grace_seconds, 30,
          "How long a worker may take to stop after a cancel or shutdown before it is killed.");
ABSL_FLAG(std::string, ready_file, "",
          "Once serving, write the bound addresses and pid to this file as JSON.");
ABSL_FLAG(std::string, tls_cert, "",
          "Serve gRPC over TLS with this PEM certificate (chain); needs --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "The PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "Require client certificates signed by this PEM CA (mTLS); needs --tls_cert.");
ABSL_FLAG(std::string, tokens_file, "",
          "Require `authorization: Bearer TOKEN` on every call: one `ROLE TOKEN` per line, roles viewer "
          "and submitter, # comments; reread on SIGHUP.");
ABSL_FLAG(std::string, allowed_roots, "",
          "Comma-separated directories every path in a job spec (data.path, checkpoint.dir) must resolve "
          "inside. Default: the state directory and your home directory.");
ABSL_FLAG(bool, version, false, "Print the version and exit.");

namespace {

std::string DefaultStateDir() {
  if (const char* dir = std::getenv("FERRY_STATE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg && *xdg) return std::string(xdg) + "/ferry";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.local/state/ferry";
}

std::string BesideThisBinary(const std::string& name) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + name;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ferryd [--listen=HOST:PORT] [--metrics_listen=HOST:PORT] "
                               "[--state_dir=DIR] [--devices=auto]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_version)) {
    std::printf("ferryd %s\n", ferry::kFerryVersion);
    return 0;
  }
  if (rest.size() > 1) {
    std::fprintf(stderr, "ferryd: unexpected argument '%s'; see ferryd --help\n", rest[1]);
    return 2;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Signals are taken by sigwait below; every thread inherits this mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ferry::DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.state_dir = absl::GetFlag(FLAGS_state_dir).empty() ? DefaultStateDir()
                                                             : absl::GetFlag(FLAGS_state_dir);
  options.devices = absl::GetFlag(FLAGS_devices);
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary).empty()
                              ? BesideThisBinary("ferry-worker")
                              : absl::GetFlag(FLAGS_worker_binary);
  auto positive = [](const char* flag, int value) {
    if (value <= 0) {
      std::fprintf(stderr, "ferryd: --%s=%d: must be at least 1\n", flag, value);
      std::exit(2);
    }
    return static_cast<size_t>(value);
  };
  options.max_queued_jobs = positive("max_queued_jobs", absl::GetFlag(FLAGS_max_queued_jobs));
  options.event_buffer_events =
      positive("event_buffer_events", absl::GetFlag(FLAGS_event_buffer_events));
  options.max_watchers_per_job =
      positive("max_watchers_per_job", absl::GetFlag(FLAGS_max_watchers_per_job));
  options.max_finished_jobs = positive("max_finished_jobs", absl::GetFlag(FLAGS_max_finished_jobs));
  if (absl::GetFlag(FLAGS_max_interrupted_runs) < 0) {
    std::fprintf(stderr, "ferryd: --max_interrupted_runs=%d: must not be negative\n",
                 absl::GetFlag(FLAGS_max_interrupted_runs));
    return 2;
  }
  options.max_interrupted_runs = static_cast<uint32_t>(absl::GetFlag(FLAGS_max_interrupted_runs));
  if (!(absl::GetFlag(FLAGS_progress_events_per_second) >= 0)) {
    std::fprintf(stderr, "ferryd: --progress_events_per_second must be 0 (every step) or more\n");
    return 2;
  }
  options.progress_events_per_second = absl::GetFlag(FLAGS_progress_events_per_second);
  if (!(absl::GetFlag(FLAGS_heartbeat_seconds) > 0) || !(absl::GetFlag(FLAGS_stop_grace_seconds) >= 0)) {
    std::fprintf(stderr, "ferryd: --heartbeat_seconds must be positive, --stop_grace_seconds not negative\n");
    return 2;
  }
  options.heartbeat_interval = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_seconds));
  options.stop_grace = absl::Seconds(absl::GetFlag(FLAGS_stop_grace_seconds));
  options.ready_file = absl::GetFlag(FLAGS_ready_file);
  for (absl::string_view dir : absl::StrSplit(absl::GetFlag(FLAGS_allowed_roots), ',', absl::SkipWhitespace())) {
    options.allowed_roots.emplace_back(absl::StripAsciiWhitespace(dir));
  }
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);

  ferry::Daemon daemon(options);
  if (absl::Status s = daemon.Start(); !s.ok()) {
    std::fprintf(stderr, "ferryd: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  std::thread shutdown;
  std::atomic<bool> stopped{false};
  const pthread_t main_thread = pthread_self();
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (stopped.load()) break;
    if (sig == SIGHUP) {
      if (options.tokens_file.empty()) {
        LOG(INFO) << "SIGHUP: nothing to reload (no --tokens_file)";
      } else if (absl::Status s = daemon.ReloadTokens(); !s.ok()) {
        LOG(WARNING) << "SIGHUP: " << s.message();
      }
      continue;
    }
    if (shutdown.joinable()) {
      LOG(WARNING) << "second " << strsignal(sig) << ": exiting at once";
      _exit(1);
    }
    LOG(INFO) << strsignal(sig) << ": shutting down (send it again to exit at once)";
    shutdown = std::thread([&daemon, &stopped, main_thread, sig] {
      daemon.Shutdown(std::string("the daemon shut down (") + strsignal(sig) + ")");
      stopped.store(true);
      pthread_kill(main_thread, SIGHUP);  // wakes the sigwait above
    });
  }
  shutdown.join();
  return 0;
}
