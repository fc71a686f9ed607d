#include "engine/common/safe_path.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace ferry {
namespace {

// Tests can turn openat2 off; the kernel can lack it (ENOSYS) or a seccomp
// filter refuse it (EPERM), which turns it off for the process.
std::atomic<bool> g_use_openat2{true};
std::atomic<bool> g_openat2_works{true};
std::atomic<void (*)()> g_after_resolve{nullptr};

std::vector<std::string> Components(absl::string_view path) {
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) parts.emplace_back(part);
  return parts;
}

std::string Prefixed(absl::string_view field, absl::string_view message) {
  return field.empty() ? std::string(message) : absl::StrCat(field, ": ", message);
}

const char* SpecialKind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return nullptr;
}

absl::Status SpecialFile(absl::string_view field, const std::string& path, mode_t mode, PathKind kind) {
  return absl::PermissionDeniedError(Prefixed(
      field, absl::StrCat(path, " is ", SpecialKind(mode), "; only ",
                          kind == PathKind::kFile ? "regular files are read" : "directories are used",
                          ", never device files, FIFOs or sockets")));
}

absl::Status Outside(absl::string_view field, const std::string& path, const ResolvedPath& resolved,
                     const AllowedRoots& roots, PathKind kind) {
  const std::string shown = path == resolved.path
                                ? absl::StrCat(path, " is outside")
                                : absl::StrCat(path, " resolves to ", resolved.path, ", outside");
  return absl::PermissionDeniedError(Prefixed(
      field, absl::StrCat(shown, " the allowed roots (", roots.Describe(), "); put the ",
                          kind == PathKind::kFile ? "file" : "directory",
                          " under one of them or start ferryd with --allowed_roots including its directory")));
}

absl::Status Errno(absl::string_view field, absl::string_view what, const std::string& path) {
  return absl::InternalError(Prefixed(field, absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno))));
}

absl::Status LinkMet(absl::string_view field, const std::string& path, const std::string& part) {
  return absl::PermissionDeniedError(Prefixed(
      field, absl::StrCat(path, ": ", part,
                          " is a symbolic link that was not there when the path was resolved; it is not "
                          "followed (replace it with the file or directory itself)")));
}

// Clears O_NONBLOCK (set so that opening a FIFO swapped in cannot block).
absl::Status Blocking(int fd, absl::string_view field, const std::string& path) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return Errno(field, "set flags on", path);
  return absl::OkStatus();
}

// Checks what an O_PATH descriptor of the final component is.
absl::Status CheckFinal(int fd, struct stat* st, PathKind kind, absl::string_view field, const std::string& path) {
  if (fstat(fd, st) != 0) return Errno(field, "stat", path);
  if (S_ISLNK(st->st_mode)) return LinkMet(field, path, path);
  if (SpecialKind(st->st_mode) != nullptr) return SpecialFile(field, path, st->st_mode, kind);
  if (kind == PathKind::kFile && S_ISDIR(st->st_mode)) {
    return absl::FailedPreconditionError(Prefixed(field, absl::StrCat(path, " is a directory, not a file")));
  }
  if (kind == PathKind::kDirectory && !S_ISDIR(st->st_mode)) {
    return absl::FailedPreconditionError(Prefixed(field, absl::StrCat(path, " is not a directory")));
  }
  return absl::OkStatus();
}

// Opens the regular file `name` in `dir` for reading after its O_PATH
// descriptor was checked (`expected`): it must still be the same file.
absl::StatusOr<UniqueFd> ReopenFile(int dir, const std::string& name, const struct stat& expected,
                                    absl::string_view field, const std::string& path,
                                    const struct open_how* how) {
  UniqueFd fd;
  if (how != nullptr) {
    fd = UniqueFd(static_cast<int>(syscall(SYS_openat2, dir, name.c_str(), how, sizeof(*how))));
  } else {
    fd = UniqueFd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  }
  if (!fd.valid()) {
    if (errno == ELOOP) return LinkMet(field, path, path);
    return Errno(field, "open", path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno(field, "stat", path);
  if (!S_ISREG(st.st_mode) || st.st_dev != expected.st_dev || st.st_ino != expected.st_ino) {
    return absl::PermissionDeniedError(
        Prefixed(field, absl::StrCat(path, " was replaced while it was being opened; try again")));
  }
  if (absl::Status s = Blocking(fd.get(), field, path); !s.ok()) return s;
  return fd;
}

// openat2 beneath `root_fd`, refusing every symbolic link. -1 with errno.
int Openat2(int root_fd, const std::string& rel, uint64_t flags) {
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = flags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0;; ++attempt) {
    const int fd = static_cast<int>(syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how)));
    // EAGAIN: a rename raced the lookup; the kernel asks to retry.
    if (fd >= 0 || errno != EAGAIN || attempt == 3) return fd;
  }
}

bool Openat2Unsupported(int err) { return err == ENOSYS || err == EPERM || err == E2BIG || err == EINVAL; }

// Opens `parts` below the directory `root_fd` (the root `root`) with
// openat2; nullopt-like NOT_FOUND for a directory still to be created and
// UNIMPLEMENTED when openat2 cannot be used, so the caller walks instead.
absl::StatusOr<UniqueFd> OpenBeneathOpenat2(int root_fd, const std::vector<std::string>& parts, PathKind kind,
                                            absl::string_view field, const std::string& path) {
  const std::string rel = absl::StrJoin(parts, "/");
  if (kind == PathKind::kDirectory) {
    const int fd = Openat2(root_fd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) return UniqueFd(fd);
    if (Openat2Unsupported(errno)) return absl::UnimplementedError("openat2");
    // A link, a file in the way, or a part to create: the walk says which.
    return absl::NotFoundError("walk");
  }
  UniqueFd fd(Openat2(root_fd, rel, O_PATH | O_CLOEXEC));
  if (!fd.valid()) {
    if (Openat2Unsupported(errno)) return absl::UnimplementedError("openat2");
    if (errno == ENOENT) return absl::NotFoundError(Prefixed(field, absl::StrCat(path, " does not exist")));
    return absl::NotFoundError("walk");
  }
  struct stat st;
  if (absl::Status s = CheckFinal(fd.get(), &st, kind, field, path); !s.ok()) return s;
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return ReopenFile(root_fd, rel, st, field, path, &how);
}

// Walks `parts` down from `root_fd` with openat(O_NOFOLLOW), creating
// missing directories when `create`.
absl::StatusOr<UniqueFd> WalkBeneath(int root_fd, const std::string& root, const std::vector<std::string>& parts,
                                     PathKind kind, bool create, absl::string_view field,
                                     const std::string& path) {
  UniqueFd cur(openat(root_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cur.valid()) return Errno(field, "open", root);
  std::string so_far = root == "/" ? "" : root;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    so_far = absl::StrCat(so_far, "/", part);
    const bool last = i + 1 == parts.size();
    if (last && kind == PathKind::kFile) {
      UniqueFd fd(openat(cur.get(), part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid()) {
        if (errno == ENOENT) return absl::NotFoundError(Prefixed(field, absl::StrCat(path, " does not exist")));
        return Errno(field, "open", path);
      }
      struct stat st;
      if (absl::Status s = CheckFinal(fd.get(), &st, kind, field, path); !s.ok()) return s;
      return ReopenFile(cur.get(), part, st, field, path, nullptr);
    }
    const int flags = (last ? O_RDONLY : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    UniqueFd next(openat(cur.get(), part.c_str(), flags));
    if (!next.valid() && errno == ENOENT && create) {
      if (mkdirat(cur.get(), part.c_str(), 0755) != 0 && errno != EEXIST) return Errno(field, "create", so_far);
      next = UniqueFd(openat(cur.get(), part.c_str(), flags));
    }
    if (!next.valid()) {
      const int err = errno;
      if (err == ENOENT) return absl::NotFoundError(Prefixed(field, absl::StrCat(path, " does not exist")));
      struct stat st;
      if ((err == ENOTDIR || err == ELOOP) && fstatat(cur.get(), part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode)) return LinkMet(field, path, so_far);
        if (SpecialKind(st.st_mode) != nullptr && last) return SpecialFile(field, so_far, st.st_mode, kind);
        return absl::FailedPreconditionError(Prefixed(
            field, last ? absl::StrCat(path, " is not a directory")
                        : absl::StrCat(path, ": ", so_far, " is not a directory")));
      }
      errno = err;
      return Errno(field, "open", so_far);
    }
    cur = std::move(next);
  }
  if (parts.empty()) {
    if (kind == PathKind::kFile) {
      return absl::FailedPreconditionError(Prefixed(field, absl::StrCat(path, " is a directory, not a file")));
    }
    UniqueFd fd(openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Errno(field, "open", root);
    return fd;
  }
  return cur;
}

absl::StatusOr<UniqueFd> OpenConfined(const AllowedRoots& roots, absl::string_view field, const std::string& path,
                                      PathKind kind, bool create) {
  absl::StatusOr<ResolvedPath> resolved = ResolvePath(path);
  if (!resolved.ok()) return absl::InvalidArgumentError(Prefixed(field, resolved.status().message()));
  const std::string root = roots.RootOf(resolved->path);
  if (root.empty()) return Outside(field, path, *resolved, roots, kind);
  if (void (*hook)() = g_after_resolve.load(); hook != nullptr) hook();
  UniqueFd root_fd(open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd.valid()) return Errno(field, "open the allowed root", root);
  const std::vector<std::string> parts = Components(absl::string_view(resolved->path).substr(root.size()));
  if (!parts.empty() && g_use_openat2.load() && g_openat2_works.load()) {
    absl::StatusOr<UniqueFd> fd = OpenBeneathOpenat2(root_fd.get(), parts, kind, field, path);
    if (fd.ok()) return fd;
    if (absl::IsUnimplemented(fd.status())) {
      g_openat2_works.store(false);
    } else if (!(absl::IsNotFound(fd.status()) && fd.status().message() == "walk")) {
      return fd.status();
    }
    // The walk reports links and files in the way by name, and creates.
  }
  return WalkBeneath(root_fd.get(), root, parts, kind, create, field, path);
}

absl::Status MakeDirsPlain(absl::string_view field, const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return Errno(field, "create", prefix);
  }
  return absl::OkStatus();
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

std::string NormalizePath(absl::string_view path) {
  std::vector<std::string> out;
  for (std::string& part : Components(path)) {
    if (part == ".") continue;
    if (part == "..") {
      if (!out.empty()) out.pop_back();
      continue;
    }
    out.push_back(std::move(part));
  }
  return absl::StrCat("/", absl::StrJoin(out, "/"));
}

absl::StatusOr<ResolvedPath> ResolvePath(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' must be an absolute path"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("the path contains a NUL character");
  }
  const std::vector<std::string> parts = Components(path);
  for (size_t k = parts.size() + 1; k-- > 0;) {
    const std::string prefix = absl::StrCat("/", absl::StrJoin(parts.begin(), parts.begin() + k, "/"));
    char buffer[PATH_MAX];
    if (realpath(prefix.c_str(), buffer) == nullptr) continue;
    ResolvedPath resolved;
    resolved.exists = k == parts.size();
    std::string joined = buffer;
    for (size_t i = k; i < parts.size(); ++i) absl::StrAppend(&joined, "/", parts[i]);
    resolved.path = NormalizePath(joined);
    return resolved;
  }
  return absl::InternalError(absl::StrCat("cannot resolve ", path, ": ", std::strerror(errno)));
}

absl::StatusOr<AllowedRoots> AllowedRoots::Make(const std::vector<std::string>& dirs) {
  std::vector<std::string> resolved;
  for (const std::string& dir : dirs) {
    if (dir.empty()) continue;
    char buffer[PATH_MAX];
    if (realpath(dir.c_str(), buffer) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": ", std::strerror(errno)));
    }
    struct stat st;
    if (stat(buffer, &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory"));
    }
    resolved.emplace_back(buffer);
  }
  // Shortest first, so a root inside another one is seen to be inside.
  std::sort(resolved.begin(), resolved.end(),
            [](const std::string& a, const std::string& b) { return a.size() != b.size() ? a.size() < b.size() : a < b; });
  AllowedRoots roots;
  for (const std::string& dir : resolved) {
    if (roots.RootOf(dir).empty()) roots.roots_.push_back(dir);
  }
  return roots;
}

absl::StatusOr<AllowedRoots> AllowedRoots::Parse(absl::string_view comma_separated) {
  std::vector<std::string> dirs;
  for (absl::string_view dir : absl::StrSplit(comma_separated, ',', absl::SkipWhitespace())) {
    dirs.emplace_back(absl::StripAsciiWhitespace(dir));
  }
  return Make(dirs);
}

std::string AllowedRoots::Describe() const { return absl::StrJoin(roots_, ", "); }

std::string AllowedRoots::ToFlag() const { return absl::StrJoin(roots_, ","); }

std::string AllowedRoots::RootOf(const std::string& resolved) const {
  for (const std::string& root : roots_) {
    if (root == "/" || resolved == root ||
        (resolved.size() > root.size() && resolved.compare(0, root.size(), root) == 0 &&
         resolved[root.size()] == '/')) {
      return root;
    }
  }
  return "";
}

absl::StatusOr<ResolvedPath> CheckConfined(const AllowedRoots& roots, absl::string_view field,
                                           const std::string& path, PathKind kind) {
  absl::StatusOr<ResolvedPath> resolved = ResolvePath(path);
  if (!resolved.ok()) return absl::InvalidArgumentError(Prefixed(field, resolved.status().message()));
  if (roots.confined() && roots.RootOf(resolved->path).empty()) {
    return Outside(field, path, *resolved, roots, kind);
  }
  struct stat st;
  if (resolved->exists) {
    if (stat(resolved->path.c_str(), &st) == 0 && SpecialKind(st.st_mode) != nullptr) {
      return SpecialFile(field, path, st.st_mode, kind);
    }
    if (kind == PathKind::kDirectory && stat(resolved->path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(Prefixed(field, absl::StrCat(path, " exists and is not a directory")));
    }
    return resolved;
  }
  if (kind == PathKind::kDirectory) {
    // Every part that exists must be a directory for the rest to be created.
    std::string existing = resolved->path;
    while (existing.size() > 1) {
      existing = existing.substr(0, std::max<size_t>(1, existing.rfind('/')));
      if (stat(existing.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
          return absl::FailedPreconditionError(Prefixed(
              field, absl::StrCat(path, " cannot be created: ", existing, " is not a directory")));
        }
        break;
      }
    }
  }
  return resolved;
}

absl::StatusOr<UniqueFd> OpenConfinedFile(const AllowedRoots& roots, absl::string_view field,
                                          const std::string& path) {
  if (roots.confined()) return OpenConfined(roots, field, path, PathKind::kFile, /*create=*/false);
  UniqueFd fd(open(path.c_str(), O_PATH | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(Prefixed(field, absl::StrCat(path, " does not exist")));
    return Errno(field, "open", path);
  }
  struct stat st;
  if (absl::Status s = CheckFinal(fd.get(), &st, PathKind::kFile, field, path); !s.ok()) return s;
  UniqueFd file(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!file.valid()) return Errno(field, "open", path);
  struct stat now;
  if (fstat(file.get(), &now) != 0) return Errno(field, "stat", path);
  if (!S_ISREG(now.st_mode)) return CheckFinal(file.get(), &now, PathKind::kFile, field, path);
  if (absl::Status s = Blocking(file.get(), field, path); !s.ok()) return s;
  return file;
}

absl::StatusOr<UniqueFd> OpenConfinedDir(const AllowedRoots& roots, absl::string_view field,
                                         const std::string& path, bool create) {
  if (roots.confined()) return OpenConfined(roots, field, path, PathKind::kDirectory, create);
  if (create) {
    if (absl::Status s = MakeDirsPlain(field, path); !s.ok()) return s;
  }
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(Prefixed(field, absl::StrCat(path, " does not exist")));
    if (errno == ENOTDIR) {
      return absl::FailedPreconditionError(Prefixed(field, absl::StrCat(path, " is not a directory")));
    }
    return Errno(field, "open", path);
  }
  return fd;
}

namespace {

// Deeper trees are left in place (each level holds a descriptor).
constexpr int kMaxRemoveDepth = 64;

absl::Status RemoveTree(int dir_fd, const std::string& name, const std::string& shown, int depth) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a plain file name"));
  }
  const std::string path = absl::StrCat(shown, "/", name);
  struct stat st;
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? absl::OkStatus() : Errno("", "examine", path);
  }
  absl::Status first = absl::OkStatus();
  if (S_ISDIR(st.st_mode)) {
    if (depth >= kMaxRemoveDepth) {
      return absl::FailedPreconditionError(absl::StrCat("cannot remove ", path, ": more than ", kMaxRemoveDepth,
                                                        " directories deep"));
    }
    UniqueFd sub(openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.valid()) return Errno("", "open", path);
    // fdopendir takes its own descriptor: the walk below keeps `sub`.
    const int listing = dup(sub.get());
    DIR* d = listing >= 0 ? fdopendir(listing) : nullptr;
    if (d == nullptr) {
      if (listing >= 0) close(listing);
      return Errno("", "list", path);
    }
    std::vector<std::string> entries;
    while (const dirent* e = readdir(d)) {
      const std::string entry = e->d_name;
      if (entry != "." && entry != "..") entries.push_back(entry);
    }
    closedir(d);
    for (const std::string& entry : entries) {
      absl::Status s = RemoveTree(sub.get(), entry, path, depth + 1);
      if (first.ok()) first = s;
    }
    if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && first.ok()) first = Errno("", "remove", path);
    return first;
  }
  if (unlinkat(dir_fd, name.c_str(), 0) != 0) return Errno("", "remove", path);
  return absl::OkStatus();
}

}  // namespace

absl::Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& shown) {
  return RemoveTree(dir_fd, name, shown, 0);
}

bool SetUseOpenat2ForTesting(bool use) { return g_use_openat2.exchange(use); }

void SetAfterResolveHookForTesting(void (*hook)()) { g_after_resolve.store(hook); }

}  // namespace ferry
