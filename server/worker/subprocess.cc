#include "server/worker/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace ferry {
namespace {

// Lowest descriptor number used for staging: above any child_fd we map.
constexpr int kStagingFloor = 100;

}  // namespace

absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<ChildFd>& fds,
                            const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  // Stage each descriptor above every target number so that no dup2 below
  // clobbers a source that is still needed, and no dup2 is a no-op (which
  // would leave close-on-exec set).
  std::vector<int> staged;
  for (const ChildFd& fd : fds) {
    const int copy = fcntl(fd.parent_fd, F_DUPFD_CLOEXEC, kStagingFloor);
    if (copy < 0) {
      for (int s : staged) close(s);
      return absl::InternalError(absl::StrCat("dup: ", strerror(errno)));
    }
    staged.push_back(copy);
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (size_t i = 0; i < fds.size(); ++i) {
    posix_spawn_file_actions_adddup2(&actions, staged[i], fds[i].child_fd);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGQUIT, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETPGROUP);

  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& extra : env) replaced = replaced || extra.rfind(name + "=", 0) == 0;
    if (!replaced) envp.push_back(*e);
  }
  for (const std::string& extra : env) envp.push_back(const_cast<char*>(extra.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  for (int s : staged) close(s);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start ", argv[0], ": ", strerror(rc)));
  }
  return pid;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("was killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

std::string FileTail(const std::string& path, size_t max_lines, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > std::streamoff(max_bytes) ? size - std::streamoff(max_bytes) : 0;
  in.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  in.read(&text[0], static_cast<std::streamsize>(text.size()));
  std::vector<std::string> lines = absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n');
  if (start > 0 && !lines.empty()) lines.erase(lines.begin());  // partial first line
  if (lines.size() > max_lines) lines.erase(lines.begin(), lines.end() - static_cast<long>(max_lines));
  return absl::StrJoin(lines, "\n");
}

}  // namespace ferry
