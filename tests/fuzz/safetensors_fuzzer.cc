// Fuzzes the safetensors index reader (engine/checkpoint/safetensors): any
// bytes give an index or an error naming the file, never a crash or a hang;
// an index accepted describes the file exactly -- every tensor's bytes are
// its dtype's size times its shape, inside the file, one after another from
// the end of the header to the end of the file.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "engine/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

using ferry::fuzz::Fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ferry::SafetensorsIndex> index = ferry::ParseSafetensorsIndex(bytes, size, "f.safetensors");
  if (!index.ok()) {
    if (index.status().code() != absl::StatusCode::kInvalidArgument) Fail("an error other than INVALID_ARGUMENT");
    if (!absl::StartsWith(index.status().message(), "f.safetensors: ")) Fail("an error not naming the file");
    return 0;
  }
  uint64_t at = 8 + ferry::SafetensorsHeaderBytes(bytes);
  for (const ferry::SafetensorsEntry& e : index->tensors) {
    if (e.offset != at) Fail("a tensor that does not follow the one before: " + e.name);
    const int64_t element = ferry::SafetensorsDtypeBytes(e.dtype);
    if (element == 0) Fail("an unknown dtype accepted: " + e.dtype);
    for (int64_t d : e.shape) {
      if (d < 0) Fail("a negative dimension accepted: " + e.name);
    }
    if (e.bytes != static_cast<uint64_t>(e.numel()) * static_cast<uint64_t>(element)) {
      Fail("bytes that do not match the shape: " + e.name);
    }
    at += e.bytes;
  }
  if (at != size) Fail("an index that does not end at the file's end");
  return 0;
}
