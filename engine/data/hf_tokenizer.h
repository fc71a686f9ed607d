#pragma once

// Hugging Face tokenizers from a model folder's tokenizer.json (and
// tokenizer_config.json): ids are those Hugging Face's `tokenizers` gives
// for the same files. Two families of files are supported, the ones the
// Llama family ships:
//   byte-level BPE   Llama 3, Qwen2/2.5/3, GPT-2: normalizer null or NFC;
//                    pre_tokenizer Split (a regex, Isolated) and/or
//                    ByteLevel; decoder ByteLevel.
//   SentencePiece-   Llama 2, Mistral, TinyLlama: normalizer Prepend("▁") and
//   style BPE        Replace(" ", "▁"); no pre_tokenizer; byte_fallback
//                    (<0xNN> tokens for characters outside the vocabulary);
//                    decoder Replace, ByteFallback, Fuse, Strip.
//
// Encoding, as Hugging Face's does it:
//   1. added_tokens (special or not) are found in the text, leftmost and
//      then longest first, and become their ids whole: first those with
//      normalized false in the raw text, then, in the normalized rest, those
//      with normalized true (lstrip/rstrip swallow the white space beside a
//      token, single_word refuses one inside a word);
//   2. each stretch between them is normalized (NFC, NFD, NFKC, NFKD,
//      Prepend, Replace, Sequence), split by the pre-tokenizers (Split with
//      a regex in PCRE2, which reads the files' Oniguruma patterns alike;
//      ByteLevel: optional prefix space, optional GPT-2 pattern, bytes to
//      GPT-2's byte alphabet), and each piece is merged by BPE: the
//      lowest-ranked adjacent pair first, the leftmost on ties, as the Rust
//      implementation's heap does. With ignore_merges a piece that is a
//      token is that token. Pieces seen before come from a cache.
// Text need not be valid UTF-8: invalid bytes pass the normalizer unchanged
// and form pieces of their own (byte-level files encode them as bytes,
// byte_fallback files as <0xNN>).
//
// Decoding runs the file's decoder chain (ByteLevel, Replace, ByteFallback,
// Fuse, Strip, Sequence); added tokens decode to their content. Unlike
// Hugging Face, bytes that are not valid UTF-8 are returned as they are,
// not as U+FFFD (TextStream, text_stream.h, replaces them when it shows
// text), and tokenizer_config.json's clean_up_tokenization_spaces (which
// would change " ." to ".") is not applied.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data/tokenizer.h"

namespace ferry {

class HfTokenizer : public Tokenizer {
 public:
  // Reads tokenizer.json and, when `config_path` is not empty,
  // tokenizer_config.json. NOT_FOUND when a file cannot be read;
  // INVALID_ARGUMENT naming the file, the JSON field and what Ferry supports
  // when a file is malformed or uses what Ferry does not implement (a model
  // other than BPE, an unknown normalizer, pre-tokenizer, post-processor or
  // decoder).
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& tokenizer_json_path,
                                                           const std::string& config_path);
  // The same from the files' contents (`config_json` empty: no
  // tokenizer_config.json); `spec` is what spec() reports, and its files
  // name the contents in messages.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromContents(absl::string_view tokenizer_json,
                                                                   absl::string_view config_json, TokenizerSpec spec);
  ~HfTokenizer() override;

  const TokenizerSpec& spec() const override { return spec_; }
  // The largest id of the vocabulary and the added tokens, plus one.
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  // The ids of `text` with no special tokens added (Hugging Face's
  // add_special_tokens=False): what `ferry data prepare` concatenates
  // documents with. Added tokens written in the text are still found.
  std::vector<uint32_t> Encode(absl::string_view text) override;
  // As Hugging Face's tokenizer(text) with add_special_tokens=True: Encode's
  // ids inside the single-sequence template. The template is
  // tokenizer_config.json's when it sets add_bos_token or add_eos_token
  // (bos_token first, eos_token last, as transformers' Llama tokenizers
  // build it), else tokenizer.json's post_processor's (TemplateProcessing,
  // possibly inside a Sequence; ByteLevel adds nothing).
  std::vector<uint32_t> EncodeWithSpecialTokens(absl::string_view text);
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;

  // tokenizer_config.json's bos_token (a string or {"content": ...}), else
  // the first special token of the post_processor's template; none when
  // neither names a token.
  std::optional<uint32_t> bos_id() const { return bos_id_; }
  // tokenizer_config.json's eos_token, else the last special token of the
  // template when it ends with one; empty when neither names a token.
  const std::vector<uint32_t>& eos_ids() const { return eos_ids_; }
  // The id of a token of the vocabulary or an added token, by its text as
  // tokenizer.json writes it.
  std::optional<uint32_t> TokenId(absl::string_view token) const;
  // Whether the model works on GPT-2's byte alphabet (a ByteLevel
  // pre-tokenizer).
  bool byte_level() const { return byte_level_; }

  // The normalizer, pre-tokenizer, decoder, added tokens and BPE tables
  // (hf_tokenizer.cc).
  struct Impl;

 private:
  explicit HfTokenizer(TokenizerSpec spec);

  // Appends the ids of `text`, a stretch between added tokens.
  void EncodeText(absl::string_view text, std::vector<uint32_t>* out);
  // Appends the ids of one pre-tokenized piece (model alphabet: raw bytes
  // for byte-level files).
  void EncodePiece(absl::string_view piece, std::vector<uint32_t>* out);

  TokenizerSpec spec_;
  std::unique_ptr<Impl> impl_;
  bool byte_level_ = false;
  // Id -> its text as tokenizer.json writes it (empty where no token has
  // the id), and whether it is an added token.
  std::vector<std::string> tokens_;
  std::vector<bool> used_;
  std::vector<bool> added_;
  std::optional<uint32_t> bos_id_;
  std::vector<uint32_t> eos_ids_;
  // Template of EncodeWithSpecialTokens: ids before and after the text.
  std::vector<uint32_t> prefix_ids_, suffix_ids_;
  // Piece -> ids, for pieces shorter than kMaxCachedPiece. Cleared when it
  // grows past kMaxCacheEntries.
  absl::flat_hash_map<std::string, std::vector<uint32_t>> cache_;
};

// The tokenizer spec of a model folder or a tokenizer.json: given a folder,
// {DIR/tokenizer.json, DIR/tokenizer_config.json} (the second only when it
// exists); given a file, that file alone. NOT_FOUND when the path does not
// exist or the folder holds no tokenizer.json.
absl::StatusOr<TokenizerSpec> HfTokenizerSpec(const std::string& dir_or_file);

}  // namespace ferry
