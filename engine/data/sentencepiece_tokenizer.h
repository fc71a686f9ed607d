#pragma once

// SentencePiece models (LLaMA-style .model files) through Debian's
// libsentencepiece, and training new ones on the user's text.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data/tokenizer.h"

namespace ferry {

namespace sentencepiece_shim {
class Processor;
}  // namespace sentencepiece_shim

class SentencePieceTokenizer : public Tokenizer {
 public:
  // INVALID_ARGUMENT naming the file when it is not a SentencePiece model.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  const TokenizerSpec& spec() const override { return spec_; }
  int64_t vocab_size() const override { return vocab_size_; }
  // The model's own normalisation applies (whitespace, NFKC, ...), so
  // decoding gives back normalised text.
  std::vector<uint32_t> Encode(absl::string_view text) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;

 private:
  SentencePieceTokenizer(std::string path, std::unique_ptr<sentencepiece_shim::Processor> processor);

  TokenizerSpec spec_;
  std::unique_ptr<sentencepiece_shim::Processor> processor_;
  int64_t vocab_size_;
};

struct SentencePieceTrainOptions {
  // Pieces in the model, including <unk>, <s> and </s>.
  int64_t vocab_size = 8000;
  // "bpe" or "unigram".
  std::string model_type = "unigram";
  // Writes PREFIX.model and PREFIX.vocab.
  std::string output_prefix;
  // Training reads at most this many lines (sampled evenly by the library
  // when there are more); 0 reads them all.
  int64_t max_sentences = 2000000;
};

// Trains a model on the lines of `inputs` (text files). INVALID_ARGUMENT
// naming the option for a bad vocab_size or model_type, or when the text
// is too small for the vocabulary (the library's message says how large it
// can be); NOT_FOUND for an input that cannot be read.
absl::Status TrainSentencePiece(const std::vector<std::string>& inputs, const SentencePieceTrainOptions& options);

}  // namespace ferry
