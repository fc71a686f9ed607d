#pragma once

// Tokenises text files into a token file (token_file.h).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/tokenizer.h"

namespace ferry {

struct PrepareStats {
  int64_t files = 0;
  int64_t tokens = 0;
  // Bytes of text read.
  int64_t bytes = 0;
};

// Called after each block of text and at the end of each input: the input,
// whether it is done, and the totals so far.
using PrepareProgress = std::function<void(const std::string& input, bool input_done, const PrepareStats& so_far)>;

// Tokenises `inputs` (files, each encoded on its own, their tokens
// concatenated in order) with `tokenizer` into `output`, with a header
// recording the tokenizer (its files made absolute), the vocabulary, the
// token width and count. Writes a temporary file beside `output` and renames
// it into place, so `output` is never left half-written.
//
// Text is read in blocks of about `block_bytes`, each cut after a line
// break that has a printable ASCII character on both sides, where GPT-2's
// pattern always splits: byte and gpt2 tokens are those of each whole file.
// (A SentencePiece model starts each block as a new sentence.) A file with
// no such line break is read whole.
absl::StatusOr<PrepareStats> PrepareTokenFile(const std::vector<std::string>& inputs, const std::string& output,
                                              Tokenizer& tokenizer, const PrepareProgress& progress = nullptr,
                                              size_t block_bytes = 1 << 20);

}  // namespace ferry
