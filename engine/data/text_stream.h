#pragma once

// Generated tokens as text, piece by piece: each piece is valid UTF-8, the
// bytes of a character split across tokens held back until it is whole.
// Pieces concatenate to the tokenizer's decoding of all the ids pushed
// (with an incomplete or invalid sequence at the end made U+FFFD by
// Finish). The whole sequence is decoded again at each push (a
// SentencePiece decoding depends on its neighbours), so n tokens cost
// O(n^2) decoding: fine for the few thousand a generation makes.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/tokenizer.h"

namespace ferry {

class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  explicit TextStream(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

  // The text `id` completes (possibly empty). INVALID_ARGUMENT for an id
  // outside the vocabulary.
  absl::StatusOr<std::string> Push(uint32_t id);
  // What is still held back, invalid bytes as U+FFFD; the stream is done.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  std::vector<uint32_t> ids_;
  // Bytes of the decoding already returned.
  size_t emitted_ = 0;
  std::string held_;
};

// The length of the longest prefix of `bytes` that ends on a character
// boundary: what can be emitted now. Invalid bytes count as characters
// (of their own), an incomplete sequence at the end does not.
size_t CompleteUtf8Prefix(const std::string& bytes);

// `bytes` with every invalid byte, and an incomplete sequence at the end,
// replaced by U+FFFD.
std::string SanitizeUtf8(const std::string& bytes);

}  // namespace ferry
