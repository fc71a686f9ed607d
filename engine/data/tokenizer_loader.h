#pragma once

// Makes a Tokenizer from its description: what `ferry data prepare` was
// given, or what a token file's header records.

#include <memory>

#include "absl/status/statusor.h"
#include "engine/data/token_file.h"
#include "engine/data/tokenizer.h"

namespace ferry {

// byte takes no files, gpt2 {vocab.json, merges.txt}, sentencepiece
// {FILE.model}, hf {tokenizer.json} or {tokenizer.json,
// tokenizer_config.json} or {a model folder} (HfTokenizerSpec,
// hf_tokenizer.h: the tokenizer's spec() then names the files).
// INVALID_ARGUMENT for an unknown or empty kind or the wrong number of
// files; otherwise the kind's own loader's errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenizerSpec& spec);

// The tokenizer a token file was made with (its header, ReadTokenFileInfo).
// INVALID_ARGUMENT for a file without a header (it records no tokenizer);
// FAILED_PRECONDITION when the files now give another vocabulary size than
// the file records (they changed since).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenFileInfo& info, const std::string& path);

}  // namespace ferry
