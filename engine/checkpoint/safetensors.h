#pragma once

// The safetensors format (what Hugging Face's tools load and write): an
// 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data, tensor after
// tensor with no gaps. Written from bytes, and read strictly -- a header
// that claims more bytes than the file holds, ranges outside the data,
// overlapping or leaving gaps, a size that does not match the dtype and
// shape: INVALID_ARGUMENT naming the tensor and the numbers -- so that a
// damaged or foreign file is refused before any of it is used. No LibTorch
// here: tensors come as bytes.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct SafetensorsTensor {
  std::string name;
  // "F32", "F16", "BF16", "I64", ...
  std::string dtype;
  std::vector<int64_t> shape;
  // Little-endian values, product(shape) x the dtype's size.
  std::string data;
};

// The file's bytes; INVALID_ARGUMENT for a tensor whose data does not match
// its dtype and shape, an unknown dtype, or a repeated name.
absl::Status SerializeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata, std::string* out);

// Bytes a value of `dtype` takes; 0 for a dtype the format does not name.
int64_t SafetensorsDtypeBytes(const std::string& dtype);

// The header's length, from the file's first 8 bytes (little-endian).
uint64_t SafetensorsHeaderBytes(absl::string_view first8);

// "[2, 3]": a shape as errors show it.
std::string FormatShape(const std::vector<int64_t>& shape);

// Where a tensor's bytes lie in its file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  // From the start of the file.
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int64_t numel() const;
};

struct SafetensorsIndex {
  // In the order of their data in the file.
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  // Null when there is no such tensor.
  const SafetensorsEntry* Find(const std::string& name) const;
};

// The largest header read (Hugging Face's own limit).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;

// Parses the index of a safetensors file `file_bytes` long whose first bytes
// are `head` (at least its 8-byte length and the header after it; more is
// ignored). `what` names the file in errors.
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view head, uint64_t file_bytes,
                                                       const std::string& what);

// The header for tensors whose data follows in the order of `entries`
// (name, dtype and shape each): the 8-byte length and the JSON, padded so
// that the data starts 8-byte aligned. Fills each entry's offset (from the
// start of the file) and bytes. INVALID_ARGUMENT for an unknown dtype, a
// negative dimension, or a bad or repeated name.
absl::StatusOr<std::string> SafetensorsHeader(std::vector<SafetensorsEntry>* entries,
                                              const std::map<std::string, std::string>& metadata);

// A safetensors file written a tensor at a time, so that no more than one
// tensor need be held: the header first (every tensor's name, dtype and
// shape are known before any value), then each tensor's bytes, in any order,
// at their place. The file is written beside `path` and renamed to it by
// Finish, once every tensor has been written and the data synced; dropped
// unfinished, it is removed.
class SafetensorsFileWriter {
 public:
  // FAILED_PRECONDITION when the file cannot be created; the header's
  // errors as SafetensorsHeader's.
  static absl::StatusOr<SafetensorsFileWriter> Create(const std::string& path, std::vector<SafetensorsEntry> entries,
                                                      const std::map<std::string, std::string>& metadata);
  SafetensorsFileWriter(SafetensorsFileWriter&& other) noexcept;
  SafetensorsFileWriter& operator=(SafetensorsFileWriter&& other) noexcept;
  ~SafetensorsFileWriter();

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // The file's size once written.
  uint64_t file_bytes() const { return file_bytes_; }
  // `name`'s data: exactly its bytes, once. INVALID_ARGUMENT for a tensor
  // the file does not have, one written already, or the wrong size.
  absl::Status Write(const std::string& name, const void* data, uint64_t bytes);
  // FAILED_PRECONDITION naming the first tensor not written, or when the
  // file cannot be synced or renamed.
  absl::Status Finish();

 private:
  SafetensorsFileWriter(int fd, std::string path, std::string tmp, std::vector<SafetensorsEntry> entries,
                        uint64_t file_bytes)
      : fd_(fd), path_(std::move(path)), tmp_(std::move(tmp)), entries_(std::move(entries)),
        written_(entries_.size(), false), file_bytes_(file_bytes) {}
  void Abandon();
  int fd_ = -1;
  std::string path_;
  std::string tmp_;
  std::vector<SafetensorsEntry> entries_;
  std::vector<bool> written_;
  uint64_t file_bytes_ = 0;
};

// A safetensors file open for reading its tensors, one at a time.
class SafetensorsReader {
 public:
  // NOT_FOUND or PERMISSION_DENIED for a file that cannot be opened,
  // INVALID_ARGUMENT for one that is not a valid safetensors file.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  ~SafetensorsReader();

  const SafetensorsIndex& index() const { return index_; }
  const std::string& path() const { return path_; }
  // Bytes [begin, begin + size) of `entry`'s data into `out`; DATA_LOSS if
  // the file has changed under the reader (shorter than its index says).
  absl::Status Read(const SafetensorsEntry& entry, uint64_t begin, uint64_t size, void* out) const;

 private:
  SafetensorsReader(int fd, std::string path, SafetensorsIndex index)
      : fd_(fd), path_(std::move(path)), index_(std::move(index)) {}
  int fd_ = -1;
  std::string path_;
  SafetensorsIndex index_;
};

}  // namespace ferry
