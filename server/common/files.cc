#include "server/common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (!in || !(text << in.rdbuf())) return absl::FailedPreconditionError(std::strerror(errno));
  return text.str();
}

absl::Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      const std::string partial = path.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot create directory ", partial, ": ", std::strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  const bool synced = fsync(fd) == 0;
  close(fd);
  if (!synced || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot replace ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

void RemoveFileOrFolder(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) {
    unlink(path.c_str());
    return;
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") unlink((path + "/" + name).c_str());
  }
  closedir(d);
  rmdir(path.c_str());
}

}  // namespace ferry
