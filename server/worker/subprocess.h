#pragma once

// Starting child processes safely from a multi-threaded daemon (posix_spawn,
// no fork), and describing how they ended.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

struct ChildFd {
  // A descriptor of the parent's...
  int parent_fd;
  // ...that the child sees under this number.
  int child_fd;
};

// Starts `argv[0]` (a path) with `argv`, the parent's environment with
// `env` ("NAME=value", replacing any NAME there) added, and only the
// descriptors in `fds` (besides none). The child gets its own process group
// (so the whole group can be signalled), an empty signal mask and default
// signal dispositions.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<ChildFd>& fds,
                            const std::vector<std::string>& env = {});

// "exited with status 3", "was killed by signal 9 (Killed)".
std::string DescribeWaitStatus(int wait_status);

// The last `max_lines` lines of the file (at most `max_bytes` of its end).
std::string FileTail(const std::string& path, size_t max_lines, size_t max_bytes);

}  // namespace ferry
