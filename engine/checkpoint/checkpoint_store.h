#pragma once

// Checkpoints on disk, written so that a crash at any moment leaves either
// the previous checkpoint or the new one, never a half of one, and read so
// that a damaged one is noticed and skipped for the one before.
//
//   ROOT/step-000000000100/MANIFEST   format, step, metadata, and each file's
//                                     size and CRC-32
//   ROOT/step-000000000100/<file>...  the contents (one per rank and kind)
//   ROOT/latest                       the newest checkpoint's name (for
//                                     people and tools; readers take the
//                                     newest directory that verifies)
//
// A checkpoint is written into ROOT/.tmp-..., every file fsynced, then
// renamed into place, then `latest` is replaced (write, fsync, rename); the
// oldest beyond `keep` are removed. No LibTorch here: contents are bytes.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Appends `size` bytes at `data` to the file being written.
using ByteSink = std::function<absl::Status(const void* data, size_t size)>;
// Writes a file's bytes, in order, into the sink it is given: a file made
// while the checkpoint is written (from wherever training keeps it) instead
// of held in memory beforehand. Called once per write.
using FileProducer = std::function<absl::Status(const ByteSink& sink)>;

// A file of a loaded checkpoint that was verified but left on disk (it is
// at least kHeldFileBytes): read it with CheckpointFileReader. The
// descriptor was opened as the checkpoint was read (through the confined
// root, if any), so reading it later reaches the same file.
struct StoredFile {
  std::shared_ptr<const int> fd;  // closed when the last copy goes
  std::string path;               // for messages
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

// Files of a loaded checkpoint this large or larger are left on disk
// (CheckpointContents::stored); smaller ones are read into `files`.
inline constexpr uint64_t kHeldFileBytes = 1 << 20;

struct CheckpointContents {
  int64_t step = 0;
  // Small named values (spec hash, world layout, schedule state...): no
  // spaces or newlines in names; values one line each.
  std::map<std::string, std::string> meta;
  // Named files: names are plain file names (no '/'). Loaded: those under
  // kHeldFileBytes.
  std::map<std::string, std::string> files;
  // To write: files produced as the checkpoint is written, after `files`.
  // A producer may read live training state; such a checkpoint must be
  // written before that state changes (AsyncCheckpointWriter writes it
  // before Submit returns).
  std::map<std::string, FileProducer> produced;
  // Loaded: files of kHeldFileBytes or more, verified and left on disk.
  std::map<std::string, StoredFile> stored;
};

// Reads one file of a checkpoint in order, whether it is held in `files` or
// left on disk in `stored`, so that a model's state can be restored piece by
// piece without the whole file in memory. A stored file is checked again as
// it is read: DATA_LOSS if it no longer matches its manifest.
class CheckpointFileReader {
 public:
  // NOT_FOUND when `contents` has no file `name`. `contents` must outlive
  // the reader.
  static absl::StatusOr<CheckpointFileReader> Open(const CheckpointContents& contents, const std::string& name);

  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - offset_; }
  // The next `size` bytes into `data`; DATA_LOSS past the end, on a short
  // read, or (on reaching the end) when the CRC-32 is not the manifest's.
  absl::Status Read(void* data, size_t size);

 private:
  const std::string* held_ = nullptr;
  const StoredFile* stored_ = nullptr;
  std::string name_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
  // Read and dropped from the page cache.
  uint64_t dropped_ = 0;
  unsigned long crc_ = 0;
};

// Writes `contents` under `root` (created with its parents if missing) and keeps the newest
// `keep` (at least 1). Produced files are written as they are produced, a
// piece at a time, and leave the page cache as they are synced. Errors name the path and the cause (a full disk
// shows as "No space left on device"); the previous checkpoints are then
// untouched.
absl::Status WriteCheckpoint(const std::string& root, const CheckpointContents& contents, int keep);

// WriteCheckpoint, LoadLatestCheckpoint and LoadCheckpointAt in a root
// already open: `root_fd` is its directory opened O_RDONLY (by
// OpenConfinedDir, say), `root` its path for messages. Everything below it
// is reached from the descriptor, one name at a time, never through a
// symbolic link, and a leftover name is removed rather than opened: a
// process confined to the root stays there whatever is created inside it
// (or done to the path of the root) while it runs.
absl::Status WriteCheckpointIn(int root_fd, const std::string& root, const CheckpointContents& contents, int keep);

// A short, stable digest of `bytes` (CRC-32 and length) for checkpoint
// metadata: e.g. of the settings a checkpoint was written under.
std::string Fingerprint(const std::string& bytes);

struct LoadedCheckpoint {
  CheckpointContents contents;
  std::string path;
  // Checkpoints passed over, newest first, each with why ("step-...: model.0:
  // CRC-32 0x1234abcd, the manifest says 0x9f00e1c2").
  std::vector<std::string> skipped;
};

// A checkpoint's MANIFEST, parsed: the step, the metadata and each file's
// expected size and CRC-32.
struct CheckpointManifest {
  struct File {
    std::string name;
    uint64_t size = 0;
    uint32_t crc32 = 0;
  };
  int64_t step = 0;
  std::map<std::string, std::string> meta;
  std::vector<File> files;  // in the manifest's order
};

// Parses a MANIFEST's text (pure: reads no files). DATA_LOSS naming what is
// wrong: a malformed line, another format version, no format line, or a file
// name that is not a plain name inside the checkpoint's directory.
absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view text);

// The newest checkpoint under `root` whose every file matches its manifest.
// NOT_FOUND when there is none (`skipped` reasons in the message).
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& root);

// The checkpoint of `step` under `root`, if every file matches its manifest:
// NOT_FOUND when there is none, DATA_LOSS (with why) when it is damaged.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointAt(const std::string& root, int64_t step);

// See WriteCheckpointIn.
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpointIn(int root_fd, const std::string& root);
absl::StatusOr<LoadedCheckpoint> LoadCheckpointIn(int root_fd, const std::string& root, int64_t step);

}  // namespace ferry
