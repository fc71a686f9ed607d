#include "server/worker/process_executor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "ferry/internal/worker.pb.h"
#include "server/common/files.h"
#include "google/protobuf/util/json_util.h"
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
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

RunOutcome Failed(std::string error) { return {ferry::v1::JOB_STATE_FAILED, std::move(error)}; }

}  // namespace

ProcessExecutor::ProcessExecutor(ProcessExecutorOptions options) : options_(std::move(options)) {}

RunOutcome ProcessExecutor::Run(const std::string& job_id, const ferry::v1::JobSpec& spec,
                                const StopSignal& stop, RunListener* listener) {
  const std::string job_dir = absl::StrCat(options_.jobs_dir, "/", job_id);
  if (absl::Status s = MakeDirs(job_dir); !s.ok()) return Failed(std::string(s.message()));
  const std::string spec_path = job_dir + "/spec.json";
  const std::string log_path = job_dir + "/worker.log";
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

  Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (log.get() < 0) return Failed(absl::StrCat("cannot open ", log_path, ": ", std::strerror(errno)));
  int command_pipe[2], report_pipe[2];
  if (pipe2(command_pipe, O_CLOEXEC) != 0) return Failed("pipe: out of descriptors");
  Fd command_read(command_pipe[0]), command_write(command_pipe[1]);
  if (pipe2(report_pipe, O_CLOEXEC) != 0) return Failed("pipe: out of descriptors");
  Fd report_read(report_pipe[0]), report_write(report_pipe[1]);

  const std::vector<std::string> argv = {options_.worker_binary, "--spec=" + spec_path,
                                         "--report_fd=3", "--device=" + options_.device};
  absl::StatusOr<pid_t> spawned =
      Spawn(argv, {{command_read.get(), 0}, {log.get(), 1}, {log.get(), 2}, {report_write.get(), 3}});
  if (!spawned.ok()) return Failed(std::string(spawned.status().message()));
  const pid_t pid = *spawned;
  command_read.Reset();
  report_write.Reset();
  log.Reset();
  LOG(INFO) << "job " << job_id << ": worker pid " << pid << ", log " << log_path;

  FrameReader reader;
  bool have_finished = false;
  Finished finished;
  bool stop_sent = false, killed = false;
  absl::Time stop_sent_at;
  std::string payload;
  char chunk[65536];

  auto handle_stop = [&] {
    if (!stop_sent && stop.requested()) {
      ferry::internal::WorkerCommand command;
      command.mutable_stop()->set_reason(stop.reason());
      (void)WriteFrame(command_write.get(), command);
      stop_sent = true;
      stop_sent_at = absl::Now();
    }
    if (stop_sent && !killed && absl::Now() - stop_sent_at > options_.stop_grace) {
      LOG(WARNING) << "job " << job_id << ": worker did not stop within "
                   << absl::FormatDuration(options_.stop_grace) << "; killing it";
      kill(-pid, SIGKILL);
      killed = true;
    }
  };

  bool open = true;
  while (open) {
    handle_stop();
    pollfd p{report_read.get(), POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t n = read(report_read.get(), chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reader.Append(chunk, static_cast<size_t>(n));
    for (;;) {
      absl::StatusOr<bool> got = reader.Next(&payload);
      if (!got.ok()) {
        LOG(ERROR) << "job " << job_id << ": " << got.status() << "; killing the worker";
        kill(-pid, SIGKILL);
        open = false;
        break;
      }
      if (!*got) break;
      WorkerReport report;
      if (!report.ParseFromString(payload)) continue;
      switch (report.kind_case()) {
        case WorkerReport::kStarted:
          listener->OnStarted(report.started().device());
          break;
        case WorkerReport::kProgress:
          listener->OnProgress(report.progress());
          break;
        case WorkerReport::kLog:
          listener->OnLog(report.log().severity(), report.log().message());
          break;
        case WorkerReport::kPlacement:
          listener->OnPlacement(report.placement());
          break;
        case WorkerReport::kFinished:
          finished = report.finished();
          have_finished = true;
          break;
        case WorkerReport::KIND_NOT_SET:
          break;
      }
    }
  }

  // The report channel is closed: the worker is exiting (or has closed it,
  // which only a broken worker does). Reap it, still honouring stop requests.
  int wait_status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &wait_status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    handle_stop();
    absl::SleepFor(absl::Milliseconds(20));
  }
  // Whatever the worker started in its group goes with it.
  kill(-pid, SIGKILL);

  if (have_finished) {
    switch (finished.outcome()) {
      case Finished::OUTCOME_SUCCEEDED:
        return {ferry::v1::JOB_STATE_SUCCEEDED, ""};
      case Finished::OUTCOME_CANCELLED:
        return {ferry::v1::JOB_STATE_CANCELLED,
                stop.requested() ? absl::StrCat(stop.reason(), " (", finished.error(), ")")
                                 : finished.error()};
      default:
        return Failed(finished.error().empty() ? "the worker reported a failure" : finished.error());
    }
  }
  if (killed) {
    return {ferry::v1::JOB_STATE_CANCELLED,
            absl::StrCat(stop.reason(), " (the worker did not stop within ",
                         absl::FormatDuration(options_.stop_grace), " and was killed)")};
  }
  std::string error = absl::StrCat("the worker ", DescribeWaitStatus(wait_status),
                                   " before finishing; its log is ", log_path);
  const std::string tail = FileTail(log_path, 5, 2000);
  if (!tail.empty()) absl::StrAppend(&error, "; it ends:\n", tail);
  return Failed(error);
}

}  // namespace ferry
