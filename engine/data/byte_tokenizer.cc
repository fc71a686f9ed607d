#include "engine/data/byte_tokenizer.h"

#include "absl/strings/str_cat.h"

namespace ferry {

std::vector<uint16_t> EncodeBytes(absl::string_view text) {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string DecodeBytes(const std::vector<uint16_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) text[i] = static_cast<char>(tokens[i] & 0xff);
  return text;
}

std::vector<uint32_t> ByteTokenizer::Encode(absl::string_view text) {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

absl::StatusOr<std::string> ByteTokenizer::Decode(absl::Span<const uint32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= kByteVocabSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", ids[i], " at position ", i, " is not below the byte vocabulary's 256"));
    }
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

}  // namespace ferry
