#include "server/worker/disk_tier_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

constexpr char kField[] = "memory.disk_dir";

// The entries of the directory `dir_fd`, or the OS's reason.
absl::StatusOr<std::vector<std::string>> Entries(int dir_fd, const std::string& shown) {
  const int listing = dup(dir_fd);
  DIR* d = listing >= 0 ? fdopendir(listing) : nullptr;
  if (d == nullptr) {
    if (listing >= 0) close(listing);
    return absl::InternalError(absl::StrCat("cannot list ", shown, ": ", std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

}  // namespace

std::string JobDiskDir(const ferry::v1::JobSpec& spec, const std::string& job_id, const std::string& job_dir) {
  if (!spec.memory().disk_dir().empty()) return absl::StrCat(spec.memory().disk_dir(), "/ferry-", job_id);
  if (!job_dir.empty()) return absl::StrCat(job_dir, "/scratch");
  return "";
}

std::string RankDiskDir(const std::string& job_disk_dir, int rank) {
  return absl::StrCat(job_disk_dir, "/rank", rank);
}

absl::Status PrepareRankDiskDir(const ferry::v1::JobSpec& spec, const std::string& rank_dir,
                                const AllowedRoots& roots) {
  const bool in_spec = !spec.memory().disk_dir().empty();
  absl::StatusOr<UniqueFd> dir = OpenConfinedDir(in_spec ? roots : AllowedRoots(), in_spec ? kField : "disk tier",
                                                 rank_dir, /*create=*/true);
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::vector<std::string>> names = Entries(dir->get(), rank_dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (absl::Status s = RemoveTreeAt(dir->get(), name, rank_dir); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(in_spec ? "memory.disk_dir: " : "disk tier: ",
                                                 "cannot remove what an earlier run left: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status RemoveJobDiskDir(const ferry::v1::JobSpec& spec, const std::string& job_id, const std::string& job_dir,
                              const AllowedRoots& roots) {
  const bool in_spec = !spec.memory().disk_dir().empty();
  if (!in_spec && job_dir.empty()) return absl::OkStatus();
  const std::string parent = in_spec ? spec.memory().disk_dir() : job_dir;
  const std::string name = in_spec ? absl::StrCat("ferry-", job_id) : "scratch";
  absl::StatusOr<UniqueFd> dir =
      OpenConfinedDir(in_spec ? roots : AllowedRoots(), in_spec ? kField : "", parent, /*create=*/false);
  if (absl::IsNotFound(dir.status())) return absl::OkStatus();
  if (!dir.ok()) return dir.status();
  return RemoveTreeAt(dir->get(), name, parent);
}

}  // namespace ferry
