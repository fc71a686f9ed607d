#include "server/worker/generate_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/internal/worker.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/common/files.h"
#include "server/worker/frame.h"
#include "server/worker/subprocess.h"

namespace ferry {
namespace {

std::atomic<uint64_t> g_generations{0};

absl::Status WriteJson(const google::protobuf::Message& message, const std::string& path) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, print).ok()) {
    return absl::InternalError(absl::StrCat("cannot write ", path, " as JSON"));
  }
  return WriteFileAtomically(path, json);
}

}  // namespace

absl::Status RunWorkerGenerate(const std::string& worker_binary, const std::string& work_dir,
                               const ferry::v1::JobSpec* spec, const ferry::v1::GenerateRequest& request,
                               const std::function<bool(const ferry::v1::GenerateResponse&)>& on_response,
                               const std::function<bool()>& cancelled, const std::string& allowed_roots) {
  if (absl::Status s = MakeDirs(work_dir); !s.ok()) return s;
  const std::string base =
      absl::StrCat(work_dir, "/generate-", absl::ToUnixMicros(absl::Now()), "-", g_generations.fetch_add(1));
  const std::string request_path = base + ".request.json";
  const std::string spec_path = base + ".spec.json";
  const std::string log_path = base + ".log";
  struct Cleanup {
    std::string request, spec, log;
    ~Cleanup() {
      unlink(request.c_str());
      unlink(spec.c_str());
      unlink(log.c_str());
    }
  } cleanup{request_path, spec_path, log_path};
  if (absl::Status s = WriteJson(request, request_path); !s.ok()) return s;
  if (spec != nullptr) {
    if (absl::Status s = WriteJson(*spec, spec_path); !s.ok()) return s;
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<std::string> argv = {worker_binary, "--generate=" + request_path, "--device=cpu", "--report_fd=3"};
  if (spec != nullptr) argv.push_back("--spec=" + spec_path);
  if (!allowed_roots.empty()) argv.push_back("--allowed_roots=" + allowed_roots);
  absl::StatusOr<pid_t> pid = Spawn(argv, {{null >= 0 ? null : pipe_fds[0], 0},
                                           {log >= 0 ? log : pipe_fds[1], 1},
                                           {log >= 0 ? log : pipe_fds[1], 2},
                                           {pipe_fds[1], 3}});
  close(pipe_fds[1]);
  if (log >= 0) close(log);
  if (null >= 0) close(null);
  const int reader = pipe_fds[0];
  struct CloseReader {
    int fd;
    ~CloseReader() { close(fd); }
  } close_reader{reader};
  if (!pid.ok()) return absl::InternalError(std::string(pid.status().message()));
  auto kill_worker = [&] {
    kill(-*pid, SIGKILL);
    int ignored = 0;
    while (waitpid(*pid, &ignored, 0) < 0 && errno == EINTR) {
    }
  };
  FrameReader frames;
  absl::Status worker_error;
  bool got_error = false;
  char buffer[1 << 16];
  for (;;) {
    if (cancelled && cancelled()) {
      kill_worker();
      return absl::CancelledError("the generation was cancelled");
    }
    pollfd p{reader, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) {
      kill_worker();
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    const ssize_t n = read(reader, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the worker closed its end: it is done
    frames.Append(buffer, static_cast<size_t>(n));
    std::string payload;
    for (;;) {
      absl::StatusOr<bool> next = frames.Next(&payload);
      if (!next.ok()) {
        kill_worker();
        return absl::InternalError(absl::StrCat("ferry-worker --generate: ", next.status().message()));
      }
      if (!*next) break;
      ferry::internal::GenerateFrame frame;
      if (!frame.ParseFromString(payload)) {
        kill_worker();
        return absl::InternalError("ferry-worker --generate sent a frame that does not parse");
      }
      if (frame.has_error()) {
        got_error = true;
        worker_error = absl::Status(static_cast<absl::StatusCode>(frame.error().code()), frame.error().message());
      } else if (!on_response(frame.response())) {
        kill_worker();
        return absl::CancelledError("the client has gone");
      }
    }
  }
  int wait_status = 0;
  while (waitpid(*pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (got_error) return worker_error.ok() ? absl::InternalError("ferry-worker --generate failed") : worker_error;
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("ferry-worker --generate ", DescribeWaitStatus(wait_status), ": ",
                                          FileTail(log_path, 5, 4096)));
}

}  // namespace ferry
