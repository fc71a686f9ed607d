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
