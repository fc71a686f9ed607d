#pragma once

// GPT-2's byte-level BPE, read from the vocab.json and merges.txt every
// GPT-2-family checkpoint ships: ids are GPT-2's for the same files.
//
// Encoding: the text is split by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (PCRE2 with Unicode properties; invalid UTF-8 bytes, which the pattern
// cannot match, form pieces of their own), and each piece's bytes are merged
// as merges.txt ranks them: the lowest-ranked adjacent pair first, every
// occurrence of it left to right, until no pair has a rank. Pieces seen
// before come from a cache. Every byte string round-trips exactly.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data/tokenizer.h"

namespace ferry {

class Gpt2Tokenizer : public Tokenizer {
 public:
  // Reads the two files. INVALID_ARGUMENT naming the file (and the line of
  // merges.txt) when one is malformed: vocab.json must be one JSON object of
  // token -> id (ids unique, 0 .. 2^24-1, holding all 256 byte tokens);
  // each merges.txt line is two tokens separated by one space whose join is
  // in vocab.json (a first line starting "#version" is skipped). NOT_FOUND
  // when a file cannot be read.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Load(const std::string& vocab_path,
                                                             const std::string& merges_path);
  // The same from the files' contents; `spec` is what spec() reports, and
  // its files name the contents in messages (vocab.json, merges.txt).
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> FromContents(absl::string_view vocab_json,
                                                                     absl::string_view merges_txt,
                                                                     TokenizerSpec spec);
  ~Gpt2Tokenizer() override;

  const TokenizerSpec& spec() const override { return spec_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::vector<uint32_t> Encode(absl::string_view text) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;

  // The pieces GPT-2's pattern splits `text` into, in order; they
  // concatenate to `text`.
  std::vector<absl::string_view> PreTokenize(absl::string_view text) const;

  // The number of merges read from merges.txt.
  int64_t merge_count() const { return static_cast<int64_t>(merges_.size()); }

 private:
  struct Regex;
  struct Merge {
    uint32_t rank;
    uint32_t id;
  };

  Gpt2Tokenizer(TokenizerSpec spec, std::unique_ptr<Regex> regex);
  // Appends the ids of one piece.
  void EncodePiece(absl::string_view piece, std::vector<uint32_t>* out);

  TokenizerSpec spec_;
  std::unique_ptr<Regex> regex_;
  // Id -> the token's bytes (empty for an id vocab.json does not use).
  std::vector<std::string> tokens_;
  std::vector<bool> used_;
  // Byte -> its token's id.
  uint32_t byte_ids_[256] = {};
  // (left id << 32 | right id) -> the merge's rank and the merged token's id.
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Piece -> ids. Cleared when it grows past kMaxCacheEntries.
  absl::flat_hash_map<std::string, std::vector<uint32_t>> cache_;
};

// GPT-2's byte -> printable code point table (bytes_to_unicode in GPT-2's
// encoder.py), the alphabet vocab.json and merges.txt are written in.
uint32_t Gpt2ByteToCodePoint(unsigned char byte);
// A vocab.json/merges.txt token (UTF-8 of mapped code points) as the bytes it
// stands for; false when it holds a code point outside the table or is not
// valid UTF-8.
bool Gpt2TokenBytes(absl::string_view token, std::string* bytes);
// The inverse: `bytes` in GPT-2's alphabet, UTF-8.
std::string Gpt2TokenText(absl::string_view bytes);

// A tokenizer file's whole contents; NOT_FOUND naming `what` and the path
// when it cannot be read.
absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path, const char* what);

}  // namespace ferry
