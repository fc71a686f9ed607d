#pragma once

// The tokenizer interface: text to token ids and back. Kinds:
//   byte           token i is byte i; vocabulary of 256; no files.
//   gpt2           GPT-2's byte-level BPE from vocab.json and merges.txt.
//   sentencepiece  a SentencePiece model (.model file).
//   hf             a Hugging Face tokenizer.json (BPE: Llama 2/3, Mistral,
//                  Qwen, GPT-2), with its tokenizer_config.json when given.
// LoadTokenizer (tokenizer_loader.h) makes one from a TokenizerSpec, the
// description a token file's header records (token_file.h).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ferry {

inline constexpr char kByteTokenizer[] = "byte";
inline constexpr char kGpt2Tokenizer[] = "gpt2";
inline constexpr char kSentencePieceTokenizer[] = "sentencepiece";
inline constexpr char kHfTokenizer[] = "hf";

// What a tokenizer is made from.
struct TokenizerSpec {
  // "byte", "gpt2", "sentencepiece" or "hf"; empty when not known (a token
  // file without a header).
  std::string kind;
  // The files it is read from, as absolute paths where they were recorded by
  // `ferry data prepare`: gpt2 {vocab.json, merges.txt}; sentencepiece
  // {FILE.model}; hf {tokenizer.json} or {tokenizer.json,
  // tokenizer_config.json}; byte none.
  std::vector<std::string> files;

  bool operator==(const TokenizerSpec& o) const { return kind == o.kind && files == o.files; }
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual const TokenizerSpec& spec() const = 0;
  const std::string& kind() const { return spec().kind; }
  // Ids are 0 .. vocab_size()-1.
  virtual int64_t vocab_size() const = 0;
  // Token ids of `text` (any bytes; byte and gpt2 round-trip every byte
  // string exactly, sentencepiece and hf apply their normalisation). Not
  // thread-safe: an implementation may cache (one tokenizer per thread).
  virtual std::vector<uint32_t> Encode(absl::string_view text) = 0;
  // The text of `ids`; INVALID_ARGUMENT for an id not below vocab_size().
  virtual absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const = 0;
};

}  // namespace ferry
