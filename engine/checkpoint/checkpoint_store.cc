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
#include "engine/common/safe_path.h"

namespace ferry {
namespace {

constexpr int kFormatVersion = 1;
constexpr char kManifest[] = "MANIFEST";
constexpr char kLatest[] = "latest";

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(errno)));
}

uLong CrcUpdate(uLong crc, const void* data, size_t size) {
  const Bytef* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, bytes, n);
    bytes += n;
    size -= n;
  }
  return crc;
}

uint32_t Crc32(const std::string& data) {
  return static_cast<uint32_t>(CrcUpdate(crc32(0L, Z_NULL, 0), data.data(), data.size()));
}

// A produced file is synced and dropped from the page cache every this many
// bytes, so that writing a model's worth of state does not fill the host's
// memory with dirty pages; a file left on disk leaves the page cache as
// often while it is read (once to verify it, once more to restore it), so
// that the restore's own allocations do not have to reclaim it first.
constexpr uint64_t kSyncEveryBytes = 256ull << 20;

// Drops [*dropped, done) of `fd` from the page cache once it is
// kSyncEveryBytes or more (or `done` is the end, `last`).
void DropBehind(int fd, uint64_t done, bool last, uint64_t* dropped) {
  if (done - *dropped < kSyncEveryBytes && !last) return;
  (void)posix_fadvise(fd, static_cast<off_t>(*dropped), static_cast<off_t>(done - *dropped), POSIX_FADV_DONTNEED);
  *dropped = done;
}

// A file name a checkpoint may hold: a plain name inside its directory,
// not the directory itself, its parent or the manifest.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name != kManifest &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

std::string DirName(int64_t step) { return absl::StrFormat("step-%012d", step); }

bool ParseDirName(const std::string& name, int64_t* step) {
  return name.size() == 17 && name.rfind("step-", 0) == 0 && absl::SimpleAtoi(name.substr(5), step);
}

absl::Status SyncFd(int fd, const std::string& path) {
  return fsync(fd) == 0 ? absl::OkStatus() : Errno("cannot sync", path);
}

// Writes the new file `name` in the directory `dir` (shown as `path`) from
// `produce`, a piece at a time, and syncs it; its size and CRC-32 into
// `file` if given. A name already there (a leftover, or anything else put in
// the way) is removed first, never opened: no link is followed and no FIFO
// waited on.
absl::Status WriteProduced(int dir, const std::string& name, const std::string& path, const FileProducer& produce,
                           CheckpointManifest::File* file = nullptr) {
  (void)unlinkat(dir, name.c_str(), 0);
  UniqueFd fd(openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return Errno("cannot create", path);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t written = 0, synced = 0;
  const ByteSink sink = [&](const void* data, size_t size) -> absl::Status {
    const char* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd.get(), bytes + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("cannot write", path);
      done += static_cast<size_t>(n);
    }
    crc = CrcUpdate(crc, data, size);
    written += size;
    if (written - synced >= kSyncEveryBytes) {
      if (fdatasync(fd.get()) != 0) return Errno("cannot sync", path);
      (void)posix_fadvise(fd.get(), static_cast<off_t>(synced), static_cast<off_t>(written - synced),
                          POSIX_FADV_DONTNEED);
      synced = written;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = produce(sink); !s.ok()) return s;
  if (fsync(fd.get()) != 0) return Errno("cannot sync", path);
  (void)posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  if (file != nullptr) {
    file->name = name;
    file->size = written;
    file->crc32 = static_cast<uint32_t>(crc);
  }
  return close(fd.Release()) == 0 ? absl::OkStatus() : Errno("cannot close", path);
}

// WriteProduced of the bytes `data`.
absl::Status WriteSynced(int dir, const std::string& name, const std::string& path, const std::string& data,
                         CheckpointManifest::File* file = nullptr) {
  return WriteProduced(
      dir, name, path, [&data](const ByteSink& sink) { return sink(data.data(), data.size()); }, file);
}

// Reads the regular file `name` in `dir`; a link, a FIFO or a device there
// is an error, never followed or waited on.
absl::StatusOr<std::string> ReadFile(int dir, const std::string& name, const std::string& path) {
  const UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return Errno("cannot open", path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is not a regular file"));
  }
  std::string data;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
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

// The directory `name` in `dir`, not through a link; invalid with errno.
UniqueFd OpenDirAt(int dir, const std::string& name) {
  return UniqueFd(openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

std::vector<std::string> ListDir(int dir) {
  std::vector<std::string> names;
  const int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return names;
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

// Removes `name` in `dir`, and what it holds if it is a directory; a link is
// removed, never followed.
void RemoveTree(int dir, const std::string& name, int depth = 0) {
  struct stat st;
  if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    unlinkat(dir, name.c_str(), 0);
    return;
  }
  const UniqueFd sub = OpenDirAt(dir, name);
  if (sub.valid() && depth < 8) {
    for (const std::string& entry : ListDir(sub.get())) RemoveTree(sub.get(), entry, depth + 1);
  }
  unlinkat(dir, name.c_str(), AT_REMOVEDIR);
}

// Step numbers of the complete-looking checkpoint directories, newest first.
std::vector<int64_t> Steps(int root) {
  std::vector<int64_t> steps;
  for (const std::string& name : ListDir(root)) {
    int64_t step = 0;
    if (ParseDirName(name, &step)) steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// The checkpoint root `root`, open; invalid with errno.
UniqueFd OpenRoot(const std::string& root) { return UniqueFd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); }

std::string Manifest(const CheckpointContents& c, const std::vector<CheckpointManifest::File>& files) {
  std::string m = absl::StrCat("format ", kFormatVersion, "\nstep ", c.step, "\n");
  for (const auto& [name, value] : c.meta) absl::StrAppend(&m, "meta ", name, " ", value, "\n");
  for (const CheckpointManifest::File& file : files) {
    absl::StrAppend(&m, "file ", file.name, " ", file.size, " ", absl::StrFormat("%08x", file.crc32), "\n");
  }
  return m;
}

// Opens the file `file` names in the checkpoint directory `dir` (shown as
// `path`) and checks it against the manifest: a regular file (never a link
// followed or a FIFO waited on) of its size, whose CRC-32, read a piece at a
// time, is the manifest's. Its bytes into `held` if given. DATA_LOSS saying
// what is wrong.
absl::StatusOr<UniqueFd> OpenVerified(int dir, const CheckpointManifest::File& file, const std::string& path,
                                      std::string* held) {
  UniqueFd fd(openat(dir, file.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  struct stat st;
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrCat(file.name, ": missing"));
  }
  if (static_cast<uint64_t>(st.st_size) != file.size) {
    return absl::DataLossError(
        absl::StrCat(file.name, ": ", st.st_size, " bytes, the manifest says ", file.size, " (truncated?)"));
  }
  if (held != nullptr) held->resize(file.size);
  std::vector<char> buffer(held != nullptr ? 0 : std::min<uint64_t>(file.size, 4 << 20));
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t done = 0, dropped = 0;
  while (done < file.size) {
    char* into = held != nullptr ? held->data() + done : buffer.data();
    const size_t want = held != nullptr ? file.size - done : std::min<uint64_t>(buffer.size(), file.size - done);
    const ssize_t n = pread(fd.get(), into, want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat(file.name, ": cannot read: ", std::strerror(errno)));
    if (n == 0) return absl::DataLossError(absl::StrCat(file.name, ": shorter than the manifest's ", file.size, " bytes"));
    crc = CrcUpdate(crc, into, static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
    if (held == nullptr) DropBehind(fd.get(), done, done == file.size, &dropped);
  }
  if (static_cast<uint32_t>(crc) != file.crc32) {
    return absl::DataLossError(absl::StrFormat("%s: CRC-32 %08x, the manifest says %08x", file.name,
                                               static_cast<uint32_t>(crc), file.crc32));
  }
  return fd;
}

// Reads and verifies one checkpoint directory; the error says what is wrong.
absl::StatusOr<CheckpointContents> ReadCheckpointDir(int root_fd, const std::string& dir, int64_t step) {
  const UniqueFd dir_fd = OpenDirAt(root_fd, DirName(step));
  if (!dir_fd.valid()) return absl::DataLossError(absl::StrCat("cannot open it: ", std::strerror(errno)));
  absl::StatusOr<std::string> text = ReadFile(dir_fd.get(), kManifest, dir + "/" + kManifest);
  if (!text.ok()) return absl::DataLossError("no readable MANIFEST (an unfinished write?)");
  absl::StatusOr<CheckpointManifest> manifest = ParseManifest(*text);
  if (!manifest.ok()) return manifest.status();
  if (manifest->step != step) {
    return absl::DataLossError(absl::StrCat("MANIFEST: step ", manifest->step, ", the directory's is ", step));
  }
  CheckpointContents c;
  c.step = manifest->step;
  c.meta = std::move(manifest->meta);
  for (const CheckpointManifest::File& file : manifest->files) {
    // Small files are held; large ones stay on disk, verified, to be read
    // in pieces.
    const bool hold = file.size < kHeldFileBytes;
    std::string bytes;
    absl::StatusOr<UniqueFd> fd = OpenVerified(dir_fd.get(), file, dir + "/" + file.name, hold ? &bytes : nullptr);
    if (!fd.ok()) return fd.status();
    if (hold) {
      c.files[file.name] = std::move(bytes);
      continue;
    }
    StoredFile stored;
    stored.fd = std::shared_ptr<const int>(new int(fd->Release()), [](const int* p) {
      close(*p);
      delete p;
    });
    stored.path = dir + "/" + file.name;
    stored.size = file.size;
    stored.crc32 = file.crc32;
    c.stored[file.name] = std::move(stored);
  }
  return c;
}

}  // namespace

absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view text) {
  CheckpointManifest m;
  bool have_format = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
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
      if (!absl::SimpleAtoi(f[1], &m.step)) return absl::DataLossError("MANIFEST: bad step");
    } else if (f[0] == "meta") {
      std::vector<std::string> kv = absl::StrSplit(f[1], absl::MaxSplits(' ', 1));
      m.meta[kv[0]] = kv.size() > 1 ? kv[1] : "";
    } else if (f[0] == "file") {
      std::vector<std::string> parts = absl::StrSplit(f[1], ' ');
      CheckpointManifest::File file;
      if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &file.size) ||
          !absl::SimpleHexAtoi(parts[2], &file.crc32)) {
        return absl::DataLossError(absl::StrCat("MANIFEST: bad file line '", line, "'"));
      }
      // Only names the writer accepts: never a path out of the checkpoint's
      // directory, nor the directory or the manifest itself.
      file.name = std::move(parts[0]);
      if (!IsPlainFileName(file.name)) {
        return absl::DataLossError(absl::StrCat("MANIFEST: bad file name in '", line, "'"));
      }
      m.files.push_back(std::move(file));
    }
  }
  if (!have_format) return absl::DataLossError("MANIFEST: no format line");
  return m;
}

std::string Fingerprint(const std::string& bytes) {
  return absl::StrFormat("crc32-%08x-%d", Crc32(bytes), bytes.size());
}

absl::Status WriteCheckpoint(const std::string& root, const CheckpointContents& contents, int keep) {
  if (absl::Status s = MakeDirs(root); !s.ok()) return s;
  const UniqueFd root_fd = OpenRoot(root);
  if (!root_fd.valid()) return Errno("cannot open", root);
  return WriteCheckpointIn(root_fd.get(), root, contents, keep);
}

absl::Status WriteCheckpointIn(int root_fd, const std::string& root, const CheckpointContents& contents, int keep) {
  // What an earlier crash left half-written.
  for (const std::string& name : ListDir(root_fd)) {
    if (name.rfind(".tmp-", 0) == 0) RemoveTree(root_fd, name);
  }
  const std::string name = DirName(contents.step);
  const std::string tmp_name = absl::StrCat(".tmp-", name, "-", getpid());
  const std::string tmp = absl::StrCat(root, "/", tmp_name);
  if (mkdirat(root_fd, tmp_name.c_str(), 0755) != 0) return Errno("cannot create", tmp);
  const UniqueFd tmp_fd = OpenDirAt(root_fd, tmp_name);
  if (!tmp_fd.valid()) {
    const absl::Status s = Errno("cannot open", tmp);
    RemoveTree(root_fd, tmp_name);
    return s;
  }
  auto fail = [&](absl::Status s) {
    RemoveTree(root_fd, tmp_name);
    return s;
  };
  std::vector<CheckpointManifest::File> written;
  for (const auto& [file, data] : contents.files) {
    if (!IsPlainFileName(file)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("checkpoint: bad file name '", file, "'")));
    }
    CheckpointManifest::File entry;
    if (absl::Status s = WriteSynced(tmp_fd.get(), file, tmp + "/" + file, data, &entry); !s.ok()) return fail(s);
    written.push_back(std::move(entry));
  }
  for (const auto& [file, produce] : contents.produced) {
    if (!IsPlainFileName(file) || contents.files.count(file) > 0) {
      return fail(absl::InvalidArgumentError(absl::StrCat("checkpoint: bad or repeated file name '", file, "'")));
    }
    CheckpointManifest::File entry;
    if (absl::Status s = WriteProduced(tmp_fd.get(), file, tmp + "/" + file, produce, &entry); !s.ok()) {
      return fail(s);
    }
    written.push_back(std::move(entry));
  }
  // The manifest last: a directory with one is complete.
  if (absl::Status s = WriteSynced(tmp_fd.get(), kManifest, tmp + "/" + kManifest, Manifest(contents, written));
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = SyncFd(tmp_fd.get(), tmp); !s.ok()) return fail(s);
  const std::string final_dir = root + "/" + name;
  RemoveTree(root_fd, name);  // an older write of the same step
  if (renameat(root_fd, tmp_name.c_str(), root_fd, name.c_str()) != 0) {
    return fail(Errno("cannot rename into", final_dir));
  }
  if (absl::Status s = SyncFd(root_fd, root); !s.ok()) return s;
  const std::string latest_tmp = std::string(kLatest) + ".tmp";
  if (absl::Status s = WriteSynced(root_fd, latest_tmp, root + "/" + latest_tmp, name + "\n"); !s.ok()) return s;
  if (renameat(root_fd, latest_tmp.c_str(), root_fd, kLatest) != 0) return Errno("cannot replace", root + "/latest");
  if (absl::Status s = SyncFd(root_fd, root); !s.ok()) return s;
  // Keep the newest `keep` up to this step. A later step is from a run that
  // resumed from an older checkpoint (the later one damaged, or not on every
  // rank) or was put there by hand: counting it would prune what this run
  // just wrote, so it goes (a resumed run writes the same steps again).
  int kept = 0;
  for (const int64_t step : Steps(root_fd)) {
    if (step > contents.step || ++kept > std::max(1, keep)) RemoveTree(root_fd, DirName(step));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointFileReader> CheckpointFileReader::Open(const CheckpointContents& contents,
                                                                const std::string& name) {
  CheckpointFileReader reader;
  reader.name_ = name;
  reader.crc_ = crc32(0L, Z_NULL, 0);
  if (auto it = contents.files.find(name); it != contents.files.end()) {
    reader.held_ = &it->second;
    reader.size_ = it->second.size();
  } else if (auto s = contents.stored.find(name); s != contents.stored.end()) {
    reader.stored_ = &s->second;
    reader.size_ = s->second.size;
  } else {
    return absl::NotFoundError(absl::StrCat("checkpoint: no file ", name));
  }
  return reader;
}

absl::Status CheckpointFileReader::Read(void* data, size_t size) {
  if (size > remaining()) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", name_, " ends ", size - remaining(),
                                            " bytes before what is read from it"));
  }
  if (held_ != nullptr) {
    std::memcpy(data, held_->data() + offset_, size);
    offset_ += size;
    return absl::OkStatus();
  }
  char* out = static_cast<char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(*stored_->fd, out + done, size - done, static_cast<off_t>(offset_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", stored_->path);
    if (n == 0) return absl::DataLossError(absl::StrCat("checkpoint: ", stored_->path, " was truncated as it was read"));
    done += static_cast<size_t>(n);
  }
  crc_ = CrcUpdate(crc_, data, size);
  offset_ += size;
  DropBehind(*stored_->fd, offset_, offset_ == size_, &dropped_);
  if (offset_ == size_) {
    if (static_cast<uint32_t>(crc_) != stored_->crc32) {
      return absl::DataLossError(absl::StrFormat("checkpoint: %s changed after it was verified (CRC-32 %08x, the "
                                                 "manifest says %08x)",
                                                 stored_->path, static_cast<uint32_t>(crc_), stored_->crc32));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& root) {
  const UniqueFd root_fd = OpenRoot(root);
  if (!root_fd.valid()) return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", root));
  return LoadLatestCheckpointIn(root_fd.get(), root);
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpointIn(int root_fd, const std::string& root) {
  LoadedCheckpoint loaded;
  // Newest first, whatever `latest` says: a crash between renaming a
  // complete checkpoint into place and updating `latest` leaves the newer
  // one valid (its manifest was written and synced before the rename).
  for (int64_t step : Steps(root_fd)) {
    const std::string name = DirName(step);
    const std::string dir = root + "/" + name;
    absl::StatusOr<CheckpointContents> c = ReadCheckpointDir(root_fd, dir, step);
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
  const UniqueFd root_fd = OpenRoot(root);
  if (!root_fd.valid()) return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, " in ", root));
  return LoadCheckpointIn(root_fd.get(), root, step);
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointIn(int root_fd, const std::string& root, int64_t step) {
  const std::vector<int64_t> steps = Steps(root_fd);
  if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, " in ", root));
  }
  LoadedCheckpoint loaded;
  loaded.path = root + "/" + DirName(step);
  absl::StatusOr<CheckpointContents> c = ReadCheckpointDir(root_fd, loaded.path, step);
  if (!c.ok()) return absl::DataLossError(absl::StrCat(loaded.path, ": ", c.status().message()));
  loaded.contents = *std::move(c);
  return loaded;
}

}  // namespace ferry
