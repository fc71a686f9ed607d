#include "engine/data/tokenizer_loader.h"

#include "absl/strings/str_cat.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/hf_tokenizer.h"
#include "engine/data/sentencepiece_tokenizer.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenizerSpec& spec) {
  auto files = [&](size_t n, const char* which) -> absl::Status {
    if (spec.files.size() == n) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", spec.kind, " takes ", which, "; ",
                                                   spec.files.size(), " files given"));
  };
  if (spec.kind == kByteTokenizer) {
    if (absl::Status s = files(0, "no files"); !s.ok()) return s;
    return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  }
  if (spec.kind == kGpt2Tokenizer) {
    if (absl::Status s = files(2, "vocab.json and merges.txt"); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> t = Gpt2Tokenizer::Load(spec.files[0], spec.files[1]);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  if (spec.kind == kSentencePieceTokenizer) {
    if (absl::Status s = files(1, "one .model file"); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> t = SentencePieceTokenizer::Load(spec.files[0]);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  if (spec.kind == kHfTokenizer) {
    if (spec.files.empty() || spec.files.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer hf takes tokenizer.json and optionally tokenizer_config.json, or a model folder; ",
          spec.files.size(), " files given"));
    }
    TokenizerSpec files = spec;
    // One path may be a model folder: its tokenizer.json and
    // tokenizer_config.json, recorded as those files.
    if (files.files.size() == 1) {
      absl::StatusOr<TokenizerSpec> resolved = HfTokenizerSpec(files.files[0]);
      if (!resolved.ok()) return resolved.status();
      files = std::move(*resolved);
    }
    absl::StatusOr<std::unique_ptr<HfTokenizer>> t =
        HfTokenizer::Load(files.files[0], files.files.size() > 1 ? files.files[1] : std::string());
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::move(*t));
  }
  if (spec.kind.empty()) {
    return absl::InvalidArgumentError("no tokenizer kind given; use byte, gpt2, sentencepiece or hf");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer '", spec.kind, "' is not one of byte, gpt2, sentencepiece, hf"));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenFileInfo& info, const std::string& path) {
  if (!info.has_header) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " has no header, so it records no tokenizer (a flat file of uint16 tokens); prepare it again "
              "with `ferry data prepare --tokenizer=...`"));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizer(info.tokenizer);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": its tokenizer: ", t.status().message()));
  if ((*t)->vocab_size() != info.vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was made with a vocabulary of ", info.vocab_size, " but its tokenizer files now give ",
        (*t)->vocab_size(), "; they changed since `ferry data prepare`"));
  }
  return t;
}

}  // namespace ferry
