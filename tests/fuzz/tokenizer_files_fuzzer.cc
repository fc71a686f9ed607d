// Fuzzes the files a tokenizer and a token file are read from
// (engine/data/gpt2_tokenizer, engine/data/token_file). The first byte picks
// the target:
//   even: the rest is a token file. ParseTokenFileHeader gives an info or
//         INVALID_ARGUMENT/FAILED_PRECONDITION naming the file, never a crash
//         or a hang; an info accepted describes the file exactly (tokens
//         8-byte aligned, offset + count x width = size, the width fits the
//         vocabulary), and its header, written again, reads back the same.
//   odd:  the rest is vocab.json, "\n--\n", merges.txt, "\n--\n", text.
//         Gpt2Tokenizer::FromContents gives a tokenizer or INVALID_ARGUMENT
//         naming the file; a tokenizer encodes the text into ids below its
//         vocabulary that decode to the text exactly.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/token_file.h"
#include "tests/fuzz/fuzz_check.h"

using ferry::fuzz::Fail;

namespace {

void TokenFile(absl::string_view bytes) {
  absl::StatusOr<ferry::TokenFileInfo> info = ferry::ParseTokenFileHeader(bytes, bytes.size(), "f.bin");
  if (!info.ok()) {
    const absl::StatusCode code = info.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kFailedPrecondition) {
      Fail("an error other than INVALID_ARGUMENT or FAILED_PRECONDITION");
    }
    if (!absl::StartsWith(info.status().message(), "f.bin")) Fail("an error not naming the file");
    return;
  }
  if (info->token_bytes != 2 && info->token_bytes != 4) Fail("a token width other than 2 or 4");
  if (info->data_offset + static_cast<uint64_t>(info->token_count) * static_cast<uint64_t>(info->token_bytes) !=
      bytes.size()) {
    Fail("an info that does not end at the file's end");
  }
  if (!info->has_header) {
    if (info->data_offset != 0 || info->token_bytes != 2) Fail("a flat file read other than as uint16");
    return;
  }
  if (info->data_offset % 8 != 0) Fail("tokens that do not start 8-byte aligned");
  if (info->token_bytes == 2 && info->vocab_size > 65536) Fail("2-byte tokens for a vocabulary over 65536");
  const std::string again = ferry::EncodeTokenFileHeader(*info);
  const std::string file = again + std::string(bytes.substr(info->data_offset));
  absl::StatusOr<ferry::TokenFileInfo> back = ferry::ParseTokenFileHeader(file, file.size(), "g.bin");
  if (!back.ok()) Fail(absl::StrCat("a header written again does not read back: ", back.status().message()));
  if (!(back->tokenizer == info->tokenizer) || back->vocab_size != info->vocab_size ||
      back->token_bytes != info->token_bytes || back->token_count != info->token_count) {
    Fail("a header written again reads back differently");
  }
}

void Gpt2Files(absl::string_view bytes) {
  const size_t first = bytes.find("\n--\n");
  const absl::string_view vocab = bytes.substr(0, first);
  absl::string_view merges, text;
  if (first != absl::string_view::npos) {
    const absl::string_view rest = bytes.substr(first + 4);
    const size_t second = rest.find("\n--\n");
    merges = rest.substr(0, second);
    if (second != absl::string_view::npos) text = rest.substr(second + 4);
  }
  absl::StatusOr<std::unique_ptr<ferry::Gpt2Tokenizer>> t =
      ferry::Gpt2Tokenizer::FromContents(vocab, merges, ferry::TokenizerSpec{"gpt2", {"vocab.json", "merges.txt"}});
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) Fail("an error other than INVALID_ARGUMENT");
    if (!absl::StartsWith(t.status().message(), "vocab.json: ") &&
        !absl::StartsWith(t.status().message(), "merges.txt: ")) {
      Fail("an error not naming the file");
    }
    return;
  }
  // Twice: the second time through the piece cache.
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<uint32_t> ids = (*t)->Encode(text);
    for (uint32_t id : ids) {
      if (id >= (*t)->vocab_size()) Fail("an id not below the vocabulary");
    }
    absl::StatusOr<std::string> back = (*t)->Decode(ids);
    if (!back.ok() || *back != text) Fail("text that does not decode back to itself");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    TokenFile(bytes);
  } else {
    Gpt2Files(bytes);
  }
  return 0;
}
