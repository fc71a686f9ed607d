#pragma once

// Token files: what `ferry data prepare` writes and TokenFileSource reads.
//
// Layout (all integers little-endian):
//   bytes 0-7    magic "FERRYTOK"
//   bytes 8-11   format version (1)
//   bytes 12-15  N, the length of the JSON that follows
//   bytes 16-    N bytes of JSON (trailing spaces allowed):
//                  {"tokenizer": {"kind": "gpt2", "files": ["/abs/vocab.json",
//                   "/abs/merges.txt"]}, "vocab_size": 50257,
//                   "token_bytes": 2, "token_count": 1234567}
//                unknown keys are ignored (later versions may add some)
//   zero bytes up to the next multiple of 8: the tokens start aligned
//   token_count tokens of token_bytes each (2: uint16 when vocab_size <=
//   65536, else 4: uint32), to the end of the file.
// The header lives in the file, not beside it, so the description cannot be
// separated from the tokens or go stale when the file is copied or renamed.
//
// A file that does not start with the magic is read as today's flat file of
// uint16 tokens with no header: tokenizer and vocabulary unknown (byte-level
// files are of this kind; no such file can start with the magic, whose
// bytes as uint16 tokens are above 17000).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data/tokenizer.h"

namespace ferry {

inline constexpr char kTokenFileMagic[] = "FERRYTOK";  // 8 bytes, no NUL in the file
inline constexpr uint32_t kTokenFileVersion = 1;
// Longest header JSON read; anything longer is refused as damaged.
inline constexpr uint32_t kMaxTokenFileJsonBytes = 1 << 20;

struct TokenFileInfo {
  // False for a flat file without a header.
  bool has_header = false;
  // Kind empty without a header.
  TokenizerSpec tokenizer;
  // 0 when not known (no header).
  int64_t vocab_size = 0;
  // 2 (uint16) or 4 (uint32).
  int token_bytes = 2;
  int64_t token_count = 0;
  // Bytes before the first token: 0 without a header, a multiple of 8 with.
  uint64_t data_offset = 0;
};

// 2 for vocabularies up to 65536 ids, else 4.
int TokenBytesFor(int64_t vocab_size);

// The header for `info` (tokenizer, vocab_size, token_bytes, token_count;
// the rest is ignored), padded to a multiple of 8 bytes, its JSON padded
// with trailing spaces to at least `min_json_bytes`. With
// min_json_bytes = TokenFileJsonBytes(info) + 20 the header has room for any
// token_count, so a writer can write it before it knows the count and
// rewrite it in place after.
std::string EncodeTokenFileHeader(const TokenFileInfo& info, size_t min_json_bytes = 0);
// The length of info's header JSON, unpadded.
size_t TokenFileJsonBytes(const TokenFileInfo& info);

// Reads the header from `head`, the file's first bytes (all of them, or at
// least the header's), given the file's size. INVALID_ARGUMENT starting with
// `path` and saying what is wrong for a truncated or damaged header or a
// size that does not match it; FAILED_PRECONDITION for a flat file of odd
// size.
absl::StatusOr<TokenFileInfo> ParseTokenFileHeader(absl::string_view head, uint64_t file_size,
                                                   const std::string& path);

// Reads the header of the file at `path`, or of `fd` (open for reading; not
// closed, its offset unchanged). NOT_FOUND for a file that cannot be opened,
// FAILED_PRECONDITION for one that is not a regular file, else as
// ParseTokenFileHeader.
absl::StatusOr<TokenFileInfo> ReadTokenFileInfo(const std::string& path);
absl::StatusOr<TokenFileInfo> ReadTokenFileInfo(int fd, const std::string& path);

}  // namespace ferry
