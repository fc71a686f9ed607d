#pragma once

// Paths confined to allowed root directories.
//
// A path is inside the roots when the object it names now — after every
// symbolic link and `..` in it is resolved — lies in one of them. Checking
// that is not enough for a process that then opens the path by name: a link
// created after the check (time of check to time of use) would be followed.
// So the Open* functions below resolve the path, find its root, open the
// root and walk down from that descriptor one component at a time, never
// following a symbolic link (openat2 with RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS where the kernel has it, else openat with O_NOFOLLOW
// per component). A link that appears between the resolution and the walk
// fails the open; it never leads outside.
//
// Only regular files and directories are opened: device files, FIFOs and
// sockets are refused. No gRPC or protobuf here.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// An owned file descriptor; closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// `path` (absolute) with "//" and "." dropped and each ".." taking away the
// component before it ("/.." is "/"). No file system access.
std::string NormalizePath(absl::string_view path);

// Where an absolute path leads now: realpath() of its longest existing
// prefix, then the rest normalized lexically (it does not exist, so it holds
// no links). INVALID_ARGUMENT for a relative path.
struct ResolvedPath {
  std::string path;
  // The whole path exists.
  bool exists = false;
};
absl::StatusOr<ResolvedPath> ResolvePath(const std::string& path);

// The directories paths must stay in. Empty: no confinement.
class AllowedRoots {
 public:
  AllowedRoots() = default;

  // Each directory must exist and be a directory; it is kept as its
  // realpath(). Duplicates and roots inside other roots are dropped.
  // INVALID_ARGUMENT naming the directory otherwise.
  static absl::StatusOr<AllowedRoots> Make(const std::vector<std::string>& dirs);
  // A comma-separated list, as the --allowed_roots flags take it. Empty
  // entries are ignored; "" is no confinement.
  static absl::StatusOr<AllowedRoots> Parse(absl::string_view comma_separated);

  bool confined() const { return !roots_.empty(); }
  const std::vector<std::string>& roots() const { return roots_; }
  // "/srv/ferry, /data", for messages.
  std::string Describe() const;
  // "/srv/ferry,/data", for a --allowed_roots flag.
  std::string ToFlag() const;

  // The root that `resolved` (an absolute path without links, `.` or `..`)
  // lies in, or "" when none does.
  std::string RootOf(const std::string& resolved) const;

 private:
  std::vector<std::string> roots_;
};

// What a confined path must be.
enum class PathKind {
  // An existing regular file.
  kFile,
  // A directory, or a path where one can be created (every existing part
  // of it a directory).
  kDirectory,
};

// Checks `path` (absolute) against `roots` without opening it: it resolves
// inside a root (any path does when `roots` is empty) and names no device
// file, FIFO or socket; a kDirectory that exists is a directory, one that
// does not can be created (its deepest existing part is a directory).
// Messages start with `field` ("data.path: ...") and say what to change.
// PERMISSION_DENIED for a path outside the roots or a special file;
// INVALID_ARGUMENT for a relative path; FAILED_PRECONDITION for a file where
// a directory must be. Does not check that a kFile exists or is a regular
// file: the caller reports that with its own code. Returns the resolved path.
absl::StatusOr<ResolvedPath> CheckConfined(const AllowedRoots& roots, absl::string_view field,
                                           const std::string& path, PathKind kind);

// Opens the regular file `path` for reading (O_RDONLY | O_CLOEXEC). With
// confined `roots` it must resolve inside them and is opened by walking down
// from its root without following links; without, it is opened as open(2)
// would. NOT_FOUND when it does not exist; PERMISSION_DENIED outside the
// roots, for a special file, or for a link met during the walk;
// FAILED_PRECONDITION for a directory. Messages start with `field`.
absl::StatusOr<UniqueFd> OpenConfinedFile(const AllowedRoots& roots, absl::string_view field,
                                          const std::string& path);

// Opens the directory `path` (O_RDONLY | O_DIRECTORY | O_CLOEXEC: usable as
// the directory of openat(), mkdirat(), renameat() and for fsync()),
// creating it and its missing parents (mode 0755) when `create`. Confined as
// OpenConfinedFile; the directories it creates are created beneath the
// root's descriptor too. NOT_FOUND when it does not exist and !create.
absl::StatusOr<UniqueFd> OpenConfinedDir(const AllowedRoots& roots, absl::string_view field,
                                         const std::string& path, bool create);

// Removes the entry `name` (a plain name, no '/') of the directory `dir_fd`,
// and, if it is a directory, everything in it, walking down by descriptor
// without following a symbolic link: a link is removed, never what it
// points at, so nothing outside `dir_fd` is touched whatever the tree
// holds. OK when `name` does not exist. The first failure (with the OS's
// reason, the path shown as `shown`/...) is returned after removing what
// can be removed; INVALID_ARGUMENT for a name that is not plain.
absl::Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& shown);

// Tests only: false makes the Open* functions walk with openat(O_NOFOLLOW)
// even where openat2 is available. Returns the previous setting.
bool SetUseOpenat2ForTesting(bool use);
// Tests only: runs between resolving a path and walking it, to change the
// file system as a racing process would. Null turns it off.
void SetAfterResolveHookForTesting(void (*hook)());

}  // namespace ferry
