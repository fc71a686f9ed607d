#pragma once

// A byte-level tokenizer: token i is byte i (vocabulary of 256).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/data/tokenizer.h"

namespace ferry {

inline constexpr int64_t kByteVocabSize = 256;

std::vector<uint16_t> EncodeBytes(absl::string_view text);
std::string DecodeBytes(const std::vector<uint16_t>& tokens);

class ByteTokenizer : public Tokenizer {
 public:
  ByteTokenizer() : spec_{kByteTokenizer, {}} {}
  const TokenizerSpec& spec() const override { return spec_; }
  int64_t vocab_size() const override { return kByteVocabSize; }
  std::vector<uint32_t> Encode(absl::string_view text) override;
  absl::StatusOr<std::string> Decode(absl::Span<const uint32_t> ids) const override;

 private:
  TokenizerSpec spec_;
};

}  // namespace ferry
