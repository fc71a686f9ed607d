#pragma once

// Writes the safetensors format (what Hugging Face's tools load): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype,
// shape and byte range, then the raw little-endian data, tensor after tensor
// with no gaps. No LibTorch here: tensors come as bytes.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

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

}  // namespace ferry
