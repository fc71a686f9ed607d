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
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct CheckpointContents {
  int64_t step = 0;
  // Small named values (spec hash, world layout, schedule state...): no
  // spaces or newlines in names; values one line each.
  std::map<std::string, std::string> meta;
  // Named files: names are plain file names (no '/').
  std::map<std::string, std::string> files;
};

// Writes `contents` under `root` (created with its parents if missing) and keeps the newest
// `keep` (at least 1). Errors name the path and the cause (a full disk
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
