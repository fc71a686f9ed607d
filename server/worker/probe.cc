#include "server/worker/probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "server/worker/subprocess.h"

namespace ferry {
namespace {

// Reads `fd` to end of file or until `deadline`; false on timeout.
bool ReadAll(int fd, absl::Time deadline, std::string* out) {
  char chunk[4096];
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    out->append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<ferry::internal::DeviceProbe> ProbeWorker(const std::string& worker_binary,
                                                         absl::Duration timeout) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError("pipe failed");
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  absl::StatusOr<pid_t> pid = Spawn({worker_binary, "--probe"},
                                    {{null_fd, 0}, {out_pipe[1], 1}, {err_pipe[1], 2}});
  close(null_fd);
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string out, err;
  bool finished = false;
  if (pid.ok()) {
    const absl::Time deadline = absl::Now() + timeout;
    finished = ReadAll(out_pipe[0], deadline, &out) && ReadAll(err_pipe[0], deadline, &err);
  }
  close(out_pipe[0]);
  close(err_pipe[0]);
  if (!pid.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--worker_binary: ", pid.status().message()));
  }
  if (!finished) kill(-*pid, SIGKILL);
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!finished) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--worker_binary: ", worker_binary, " --probe did not answer within ",
        absl::FormatDuration(timeout)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--worker_binary: ", worker_binary, " --probe ", DescribeWaitStatus(status),
                     err.empty() ? "" : ": ", absl::StripAsciiWhitespace(err)));
  }
  ferry::internal::DeviceProbe probe;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(out, &probe, options).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--worker_binary: ", worker_binary, " --probe printed something that is not a probe: ",
        absl::StripAsciiWhitespace(out).substr(0, 200)));
  }
  return probe;
}

}  // namespace ferry
