#include "engine/data/sentencepiece_tokenizer.h"

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "third_party/sentencepiece_shim.h"

namespace ferry {

SentencePieceTokenizer::SentencePieceTokenizer(std::string path,
                                               std::unique_ptr<sentencepiece_shim::Processor> processor)
    : spec_{kSentencePieceTokenizer, {std::move(path)}},
      processor_(std::move(processor)),
      vocab_size_(processor_->size()) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(const std::string& model_path) {
  std::ifstream probe(model_path, std::ios::binary);
  if (!probe) return absl::NotFoundError(absl::StrCat("cannot read SentencePiece model ", model_path));
  std::string error;
  std::unique_ptr<sentencepiece_shim::Processor> processor = sentencepiece_shim::Processor::Load(model_path, &error);
  if (processor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": not a SentencePiece model (", error, "); give the .model file it was trained into"));
  }
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(model_path, std::move(processor)));
}

std::vector<uint32_t> SentencePieceTokenizer::Encode(absl::string_view text) {
  const std::vector<int> ids = processor_->Encode(std::string_view(text.data(), text.size()));
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::vector<int> in(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= static_cast<uint64_t>(vocab_size_)) {
      return absl::InvalidArgumentError(absl::StrCat("token ", ids[i], " at position ", i, " is not below ",
                                                     spec_.files[0], "'s ", vocab_size_, " pieces"));
    }
    in[i] = static_cast<int>(ids[i]);
  }
  return processor_->Decode(in);
}

absl::Status TrainSentencePiece(const std::vector<std::string>& inputs, const SentencePieceTrainOptions& options) {
  if (inputs.empty()) return absl::InvalidArgumentError("no input files given");
  if (options.output_prefix.empty()) return absl::InvalidArgumentError("--out: give the model's PREFIX");
  if (options.model_type != "bpe" && options.model_type != "unigram") {
    return absl::InvalidArgumentError(
        absl::StrCat("--model_type: '", options.model_type, "' is not one of bpe, unigram"));
  }
  if (options.vocab_size < 8 || options.vocab_size > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_size: ", options.vocab_size, " is out of range; use 8 to 16777216"));
  }
  for (const std::string& input : inputs) {
    if (!std::ifstream(input)) return absl::NotFoundError(absl::StrCat("cannot read input ", input));
  }
  // Lines of every input in turn.
  size_t file = 0;
  std::ifstream in;
  auto next = [&](std::string* line) {
    for (;;) {
      if (in.is_open() && std::getline(in, *line)) return true;
      if (file == inputs.size()) return false;
      in = std::ifstream(inputs[file++]);
    }
  };
  std::map<std::string, std::string> flags = {
      {"model_prefix", options.output_prefix},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"model_type", options.model_type},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      // Characters seen in training are all kept: text is not lost to <unk>.
      {"character_coverage", "1.0"},
      // Progress lines only for warnings and errors.
      {"minloglevel", "1"},
  };
  std::string error;
  if (!sentencepiece_shim::Train(flags, next, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("training the SentencePiece model failed: ", error));
  }
  return absl::OkStatus();
}

}  // namespace ferry
