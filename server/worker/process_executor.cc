#include "server/worker/process_executor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "ferry/internal/worker.pb.h"
#include "server/common/files.h"
#include "google/protobuf/util/json_util.h"
#include "engine/common/safe_path.h"
#include "server/worker/disk_tier_dir.h"
#include "server/worker/frame.h"
#include "server/worker/subprocess.h"

namespace ferry {
namespace {

using ferry::internal::Finished;
using ferry::internal::WorkerReport;

// Closes a descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

RunOutcome Failed(std::string error) { return {ferry::v1::JOB_STATE_FAILED, std::move(error)}; }

}  // namespace

ProcessExecutor::ProcessExecutor(ProcessExecutorOptions options) : options_(std::move(options)) {}

namespace {

// One rank's process and channels.
struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  std::string log_path;
  Fd command_write;
  Fd report_read;
  FrameReader reader;
  bool open = true;  // its report channel
  bool have_finished = false;
  Finished finished;
  bool reaped = false;
  int wait_status = 0;
};

// A port on loopback that was free a moment ago, for rank 0's store.
absl::StatusOr<int> FreeLoopbackPort() {
  Fd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) return absl::UnavailableError("socket: out of descriptors");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::UnavailableError(absl::StrCat("no free loopback port: ", std::strerror(errno)));
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

RunOutcome ProcessExecutor::Run(const std::string& job_id, const ferry::v1::JobSpec& spec,
                                const StopSignal& stop, RunListener* listener) {
  const std::string job_dir = absl::StrCat(options_.jobs_dir, "/", job_id);
  if (absl::Status s = MakeDirs(job_dir); !s.ok()) return Failed(std::string(s.message()));
  const std::string spec_path = job_dir + "/spec.json";
  {
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    print.add_whitespace = true;
    (void)google::protobuf::util::MessageToJsonString(spec, &json, print);
    if (absl::Status s = WriteFileAtomically(spec_path, json); !s.ok()) {
      return Failed(std::string(s.message()));
    }
  }

  // One worker per rank; rank 0 hosts the rendezvous store and reports the
  // job's progress.
  const int world = static_cast<int>(std::max<uint32_t>(1, spec.parallel().tensor()) *
                                     std::max<uint32_t>(1, spec.parallel().data()));
  int port = 0;
  if (world > 1) {
    absl::StatusOr<int> free = FreeLoopbackPort();
    if (!free.ok()) return Failed(std::string(free.status().message()));
    port = *free;
  }
  std::vector<std::unique_ptr<RankProcess>> ranks;
  auto kill_all = [&] {
    for (const auto& r : ranks) {
      if (r->pid > 0 && !r->reaped) kill(-r->pid, SIGKILL);
    }
  };
  for (int rank = 0; rank < world; ++rank) {
    auto r = std::make_unique<RankProcess>();
    r->rank = rank;
    r->log_path = rank == 0 ? job_dir + "/worker.log" : absl::StrCat(job_dir, "/worker.rank", rank, ".log");
    Fd log(open(r->log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (log.get() < 0) {
      kill_all();
      return Failed(absl::StrCat("cannot open ", r->log_path, ": ", std::strerror(errno)));
    }
    int command_pipe[2], report_pipe[2];
    if (pipe2(command_pipe, O_CLOEXEC) != 0) {
      kill_all();
      return Failed("pipe: out of descriptors");
    }
    Fd command_read(command_pipe[0]);
    r->command_write.Reset(command_pipe[1]);
    if (pipe2(report_pipe, O_CLOEXEC) != 0) {
      kill_all();
      return Failed("pipe: out of descriptors");
    }
    r->report_read.Reset(report_pipe[0]);
    Fd report_write(report_pipe[1]);
    std::vector<std::string> env;
    if (world > 1) {
      env = {absl::StrCat("RANK=", rank), absl::StrCat("WORLD_SIZE=", world), absl::StrCat("LOCAL_RANK=", rank),
             "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)};
    }
    std::vector<std::string> argv = {options_.worker_binary, "--spec=" + spec_path, "--report_fd=3",
                                     "--device=" + options_.device, absl::StrCat("--parent_pid=", getpid()),
                                     "--job_id=" + job_id, "--job_dir=" + job_dir};
    if (!options_.allowed_roots.empty()) argv.push_back("--allowed_roots=" + options_.allowed_roots);
    absl::StatusOr<pid_t> spawned =
        Spawn(argv, {{command_read.get(), 0}, {log.get(), 1}, {log.get(), 2}, {report_write.get(), 3}}, env);
    if (!spawned.ok()) {
      kill_all();
      return Failed(std::string(spawned.status().message()));
    }
    r->pid = *spawned;
    LOG(INFO) << "job " << job_id << ": rank " << rank << " of " << world << ", worker pid " << r->pid
              << ", log " << r->log_path;
    ranks.push_back(std::move(r));
  }

  bool stop_sent = false, killed = false;
  absl::Time stop_sent_at;
  // The first rank to end without finishing well: the job fails with it.
  const RankProcess* culprit = nullptr;
  // Once a rank has failed, the others get a moment to report the
  // collective that failed with it before they are killed.
  absl::Time kill_others_at = absl::InfiniteFuture();
  std::string payload;
  char chunk[65536];

  auto handle_stop = [&] {
    if (!stop_sent && stop.requested()) {
      ferry::internal::WorkerCommand command;
      command.mutable_stop()->set_reason(stop.reason());
      for (const auto& r : ranks) (void)WriteFrame(r->command_write.get(), command);
      stop_sent = true;
      stop_sent_at = absl::Now();
    }
    if (stop_sent && !killed && absl::Now() - stop_sent_at > options_.stop_grace) {
      LOG(WARNING) << "job " << job_id << ": workers did not stop within "
                   << absl::FormatDuration(options_.stop_grace) << "; killing them";
      kill_all();
      killed = true;
    }
  };
  auto failed_badly = [](const RankProcess& r) {
    return !r.have_finished || r.finished.outcome() == Finished::OUTCOME_FAILED;
  };
  auto reap = [&](RankProcess& r, bool block) {
    if (r.reaped) return;
    for (;;) {
      const pid_t done = waitpid(r.pid, &r.wait_status, block ? 0 : WNOHANG);
      if (done == r.pid) {
        r.reaped = true;
        // Whatever the worker started in its group goes with it.
        kill(-r.pid, SIGKILL);
        return;
      }
      if (done == 0 || (done < 0 && errno != EINTR)) return;
    }
  };

  for (;;) {
    handle_stop();
    if (absl::Now() >= kill_others_at) {
      kill_all();
      kill_others_at = absl::InfiniteFuture();
    }
    std::vector<pollfd> fds;
    std::vector<RankProcess*> polled;
    for (const auto& r : ranks) {
      if (!r->open) continue;
      fds.push_back({r->report_read.get(), POLLIN, 0});
      polled.push_back(r.get());
    }
    if (fds.empty()) break;
    const int ready = poll(fds.data(), fds.size(), 100);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      RankProcess& r = *polled[i];
      const ssize_t n = read(r.report_read.get(), chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        // The rank is exiting: if it did not finish well, so does the job.
        r.open = false;
        reap(r, /*block=*/false);
        if (culprit == nullptr && failed_badly(r) && !stop_sent) {
          culprit = &r;
          if (world > 1) {
            LOG(WARNING) << "job " << job_id << ": rank " << r.rank << " ended; stopping the other ranks";
            kill_others_at = absl::Now() + std::min(options_.stop_grace, absl::Seconds(5));
          } else {
            kill_all();
          }
        }
        continue;
      }
      r.reader.Append(chunk, static_cast<size_t>(n));
      for (;;) {
        absl::StatusOr<bool> got = r.reader.Next(&payload);
        if (!got.ok()) {
          LOG(ERROR) << "job " << job_id << ": rank " << r.rank << ": " << got.status() << "; killing the workers";
          kill_all();
          r.open = false;
          break;
        }
        if (!*got) break;
        WorkerReport report;
        if (!report.ParseFromString(payload)) continue;
        const bool primary = r.rank == 0;
        switch (report.kind_case()) {
          case WorkerReport::kStarted:
            if (primary) listener->OnStarted(report.started().device());
            break;
          case WorkerReport::kProgress:
            if (primary) listener->OnProgress(report.progress());
            break;
          case WorkerReport::kLog:
            if (primary || report.log().severity() != ferry::v1::SEVERITY_INFO) {
              listener->OnLog(report.log().severity(),
                              primary ? report.log().message() : absl::StrCat("rank ", r.rank, ": ", report.log().message()));
            }
            break;
          case WorkerReport::kPlacement:
            listener->OnPlacement(report.placement());  // each rank its own
            break;
          case WorkerReport::kCheckpoint:
            if (primary) listener->OnCheckpoint(report.checkpoint());
            break;
          case WorkerReport::kCheckpointFailed:
            listener->OnCheckpointFailed(report.checkpoint_failed().step());  // any rank's
            break;
          case WorkerReport::kFinished:
            r.finished = report.finished();
            r.have_finished = true;
            break;
          case WorkerReport::KIND_NOT_SET:
            break;
        }
      }
    }
  }

  // Every report channel is closed: reap every rank, still honouring stop
  // requests.
  for (const auto& r : ranks) {
    while (!r->reaped) {
      reap(*r, /*block=*/false);
      if (r->reaped) break;
      handle_stop();
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  // The disk tier's chunk files are scratch: with every worker gone nothing
  // reads them again (a restarted or resumed run starts from its
  // checkpoint), so they go now, whatever the outcome.
  if (absl::StatusOr<AllowedRoots> roots = AllowedRoots::Parse(options_.allowed_roots); !roots.ok()) {
    LOG(WARNING) << "job " << job_id << ": disk tier files not removed: --allowed_roots: " << roots.status();
  } else if (absl::Status s = RemoveJobDiskDir(spec, job_id, job_dir, *roots); !s.ok()) {
    LOG(WARNING) << "job " << job_id << ": disk tier files not removed: " << s;
  }

  if (culprit == nullptr) {
    for (const auto& r : ranks) {
      if (failed_badly(*r) && !(killed || stop_sent)) {
        culprit = r.get();
        break;
      }
    }
  }

  const std::string who = world > 1 && culprit != nullptr ? absl::StrCat("rank ", culprit->rank, ": ") : "";
  // What another rank said failed with it (the collective, for a rank that
  // died or hung).
  std::string seen_by;
  for (const auto& r : ranks) {
    if (culprit != nullptr && r.get() != culprit && r->have_finished &&
        r->finished.outcome() == Finished::OUTCOME_FAILED && !r->finished.error().empty()) {
      seen_by = absl::StrCat("; rank ", r->rank, ": ", r->finished.error());
      break;
    }
  }
  if (culprit != nullptr && culprit->have_finished) {
    return Failed(who + (culprit->finished.error().empty() ? "the worker reported a failure" : culprit->finished.error()) +
                  seen_by);
  }
  if (culprit != nullptr) {
    std::string error = absl::StrCat(who, "the worker ", DescribeWaitStatus(culprit->wait_status),
                                     " before finishing; its log is ", culprit->log_path, seen_by);
    const std::string tail = FileTail(culprit->log_path, 5, 2000);
    if (!tail.empty()) absl::StrAppend(&error, "; it ends:\n", tail);
    return Failed(error);
  }
  const RankProcess& first = *ranks[0];
  if (first.have_finished) {
    switch (first.finished.outcome()) {
      case Finished::OUTCOME_SUCCEEDED:
        return {ferry::v1::JOB_STATE_SUCCEEDED, ""};
      case Finished::OUTCOME_CANCELLED:
        return {ferry::v1::JOB_STATE_CANCELLED,
                stop.requested() ? absl::StrCat(stop.reason(), " (", first.finished.error(), ")")
                                 : first.finished.error()};
      default:
        break;
    }
  }
  if (killed) {
    return {ferry::v1::JOB_STATE_CANCELLED,
            absl::StrCat(stop.reason(), " (the worker did not stop within ",
                         absl::FormatDuration(options_.stop_grace), " and was killed)")};
  }
  return Failed(absl::StrCat("the worker ", DescribeWaitStatus(first.wait_status),
                             " before finishing; its log is ", first.log_path));
}

}  // namespace ferry
