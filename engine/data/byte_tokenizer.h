#pragma once

// A byte-level tokenizer: token i is byte i (vocabulary of 256), and the tool
// that turns text files into the token files TokenFileSource reads.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

inline constexpr int64_t kByteVocabSize = 256;

std::vector<uint16_t> EncodeBytes(absl::string_view text);
std::string DecodeBytes(const std::vector<uint16_t>& tokens);

struct PrepareStats {
  int64_t files = 0;
  int64_t tokens = 0;
};

// Tokenises `inputs` (files, concatenated in order) into `output` as flat
// little-endian uint16 tokens. Writes a temporary file beside `output` and
// renames it into place, so `output` is never left half-written.
// `on_file`, if set, is called after each input with its path and the tokens
// written so far.
absl::StatusOr<PrepareStats> PrepareTokenFile(
    const std::vector<std::string>& inputs, const std::string& output,
    const std::function<void(const std::string&, int64_t)>& on_file = nullptr);

}  // namespace ferry
