#include "engine/checkpoint/checkpoint_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

constexpr int kFormatVersion = 1;
constexpr char kManifest[] = "MANIFEST";
constexpr char kLatest[] = "latest";

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(errno)));
}

uint32_t Crc32(const std::string& data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < data.size()) {
    const uInt n = static_cast<uInt>(std::min<size_t>(data.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

std::string DirName(int64_t step) { return absl::StrFormat("step-%012d", step); }

bool ParseDirName(const std::string& name, int64_t* step) {
  return name.size() == 17 && name.rfind("step-", 0) == 0 && absl::SimpleAtoi(name.substr(5), step);
}

absl::Status SyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? absl::OkStatus() : Errno("cannot sync", path);
}

// Writes `data` to `path` and syncs it.
absl::Status WriteSynced(const std::string& path, const std::string& data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const absl::Status s = Errno("cannot write", path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const absl::Status s = Errno("cannot sync", path);
    close(fd);
    return s;
  }
  return close(fd) == 0 ? absl::OkStatus() : Errno("cannot close", path);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  std::string data;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status s = Errno("cannot read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

// mkdir -p.
absl::Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return Errno("cannot create", prefix);
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint: ", path, " is not a directory"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

void RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& name : ListDir(path)) RemoveTree(path + "/" + name);
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

// Step numbers of the complete-looking checkpoint directories, newest first.
std::vector<int64_t> Steps(const std::string& root) {
  std::vector<int64_t> steps;
  for (const std::string& name : ListDir(root)) {
    int64_t step = 0;
    if (ParseDirName(name, &step)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string Manifest(const CheckpointContents& c) {
  std::string m = absl::StrCat("format ", kFormatVersion, "\nstep ", c.step, "\n");
  for (const auto& [name, value] : c.meta) absl::StrAppend(&m, "meta ", name, " ", value, "\n");
  for (const auto& [name, data] : c.files) {
    absl::StrAppend(&m, "file ", name, " ", data.size(), " ", absl::StrFormat("%08x", Crc32(data)), "\n");
  }
  return m;
}

// Reads and verifies one checkpoint directory; the error says what is wrong.
absl::StatusOr<CheckpointContents> ReadCheckpointDir(const std::string& dir) {
  absl::StatusOr<std::string> manifest = ReadFile(dir + "/" + kManifest);
  if (!manifest.ok()) return absl::DataLossError("no readable MANIFEST (an unfinished write?)");
  CheckpointContents c;
  bool have_format = false;
  for (absl::string_view line : absl::StrSplit(*manifest, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    if (f.size() != 2) return absl::DataLossError(absl::StrCat("MANIFEST: bad line '", line, "'"));
    if (f[0] == "format") {
      int version = 0;
      if (!absl::SimpleAtoi(f[1], &version) || version != kFormatVersion) {
        return absl::DataLossError(
            absl::StrCat("MANIFEST: format ", f[1], ", this build reads format ", kFormatVersion));
      }
      have_format = true;
    } else if (f[0] == "step") {
      if (!absl::SimpleAtoi(f[1], &c.step)) return absl::DataLossError("MANIFEST: bad step");
    } else if (f[0] == "meta") {
      std::vector<std::string> kv = absl::StrSplit(f[1], absl::MaxSplits(' ', 1));
      c.meta[kv[0]] = kv.size() > 1 ? kv[1] : "";
    } else if (f[0] == "file") {
      std::vector<std::string> parts = absl::StrSplit(f[1], ' ');
      uint64_t size = 0;
      uint32_t crc = 0;
      if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &size) || !absl::SimpleHexAtoi(parts[2], &crc)) {
        return absl::DataLossError(absl::StrCat("MANIFEST: bad file line '", line, "'"));
      }
      absl::StatusOr<std::string> data = ReadFile(dir + "/" + parts[0]);
      if (!data.ok()) return absl::DataLossError(absl::StrCat(parts[0], ": missing"));
      if (data->size() != size) {
        return absl::DataLossError(
            absl::StrCat(parts[0], ": ", data->size(), " bytes, the manifest says ", size, " (truncated?)"));
      }
      const uint32_t actual = Crc32(*data);
      if (actual != crc) {
        return absl::DataLossError(absl::StrFormat("%s: CRC-32 %08x, the manifest says %08x", parts[0], actual, crc));
      }
      c.files[parts[0]] = *std::move(data);
    }
  }
  if (!have_format) return absl::DataLossError("MANIFEST: no format line");
  return c;
}

}  // namespace

std::string Fingerprint(const std::string& bytes) {
  return absl::StrFormat("crc32-%08x-%d", Crc32(bytes), bytes.size());
}

absl::Status WriteCheckpoint(const std::string& root, const CheckpointContents& contents, int keep) {
  if (absl::Status s = MakeDirs(root); !s.ok()) return s;
  // What an earlier crash left half-written.
  for (const std::string& name : ListDir(root)) {
    if (name.rfind(".tmp-", 0) == 0) RemoveTree(root + "/" + name);
  }
  const std::string name = DirName(contents.step);
  const std::string tmp = absl::StrCat(root, "/.tmp-", name, "-", getpid());
  if (mkdir(tmp.c_str(), 0755) != 0) return Errno("cannot create", tmp);
  auto fail = [&](absl::Status s) {
    RemoveTree(tmp);
    return s;
  };
  for (const auto& [file, data] : contents.files) {
    if (file.empty() || file.find('/') != std::string::npos || file == kManifest) {
      return fail(absl::InvalidArgumentError(absl::StrCat("checkpoint: bad file name '", file, "'")));
    }
    if (absl::Status s = WriteSynced(tmp + "/" + file, data); !s.ok()) return fail(s);
  }
  // The manifest last: a directory with one is complete.
  if (absl::Status s = WriteSynced(tmp + "/" + kManifest, Manifest(contents)); !s.ok()) return fail(s);
  if (absl::Status s = SyncPath(tmp); !s.ok()) return fail(s);
  const std::string final_dir = root + "/" + name;
  RemoveTree(final_dir);  // an older write of the same step
  if (rename(tmp.c_str(), final_dir.c_str()) != 0) return fail(Errno("cannot rename into", final_dir));
  if (absl::Status s = SyncPath(root); !s.ok()) return s;
  const std::string latest_tmp = root + "/" + kLatest + ".tmp";
  if (absl::Status s = WriteSynced(latest_tmp, name + "\n"); !s.ok()) return s;
  if (rename(latest_tmp.c_str(), (root + "/" + kLatest).c_str()) != 0) return Errno("cannot replace", root + "/latest");
  if (absl::Status s = SyncPath(root); !s.ok()) return s;
  const std::vector<int64_t> steps = Steps(root);
  for (size_t i = static_cast<size_t>(std::max(1, keep)); i < steps.size(); ++i) {
    RemoveTree(root + "/" + DirName(steps[i]));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& root) {
  LoadedCheckpoint loaded;
  // Newest first, whatever `latest` says: a crash between renaming a
  // complete checkpoint into place and updating `latest` leaves the newer
  // one valid (its manifest was written and synced before the rename).
  for (int64_t step : Steps(root)) {
    const std::string name = DirName(step);
    const std::string dir = root + "/" + name;
    absl::StatusOr<CheckpointContents> c = ReadCheckpointDir(dir);
    if (!c.ok()) {
      loaded.skipped.push_back(absl::StrCat(name, ": ", c.status().message()));
      continue;
    }
    loaded.contents = *std::move(c);
    loaded.path = dir;
    return loaded;
  }
  std::string why = loaded.skipped.empty() ? "" : absl::StrCat(" (skipped: ", absl::StrJoin(loaded.skipped, "; "), ")");
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", root, why));
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointAt(const std::string& root, int64_t step) {
  const std::vector<int64_t> steps = Steps(root);
  if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, " in ", root));
  }
  LoadedCheckpoint loaded;
  loaded.path = root + "/" + DirName(step);
  absl::StatusOr<CheckpointContents> c = ReadCheckpointDir(loaded.path);
  if (!c.ok()) return absl::DataLossError(absl::StrCat(loaded.path, ": ", c.status().message()));
  loaded.contents = *std::move(c);
  return loaded;
}

}  // namespace ferry
